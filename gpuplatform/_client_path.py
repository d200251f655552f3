"""Where the repository's own client package lives when it is not installed yet.

`make install` installs `client/` (editable) into the venv; a venv made before `client/`
existed, or a plain `python -m gpuplatform.cli` from the checkout, finds it here instead."""

import importlib.util
import pathlib
import sys

CLIENT_DIR = pathlib.Path(__file__).resolve().parent.parent / "client"

if importlib.util.find_spec("gpuplatform_client") is None and CLIENT_DIR.is_dir():
    sys.path.append(str(CLIENT_DIR))
