"""`python -m gpuplatform.cli ...`: the `gpuplatform` command from the checkout. It lives in the
client package (`client/gpuplatform_client/cli.py`, installed by `pip install ./client`)."""

import sys

from gpuplatform import _client_path  # noqa: F401 (the checkout's client/ when not installed)
from gpuplatform_client.cli import main, parser

__all__ = ("main", "parser")

if __name__ == "__main__":
    sys.exit(main())
