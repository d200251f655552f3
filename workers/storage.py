"""Put local files into Django's storage (logs while they grow, artifacts at the end)."""

import os
import pathlib
import shutil
import tempfile

from django.core.files import File
from django.core.files.storage import default_storage


def put_file(name: str, source: pathlib.Path) -> None:
    """Replace `name` in storage with the content of `source`. On the filesystem storage the
    swap is atomic (readers never see a half-written log); elsewhere delete-then-save."""
    try:
        target = pathlib.Path(default_storage.path(name))
    except NotImplementedError:
        if default_storage.exists(name):
            default_storage.delete(name)
        with open(source, "rb") as handle:
            default_storage.save(name, File(handle))
        return
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.")
    with os.fdopen(fd, "wb") as out, open(source, "rb") as handle:
        shutil.copyfileobj(handle, out)
    os.replace(tmp, target)
