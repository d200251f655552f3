"""Open files a job wrote without following its links (contract 4 of issue 16; pure Python).

A job controls its own dirs: it can put a symlink or a hard link where the agent expects its
checkpoint, an artifact or its log, pointing at the database or another job's files. Every such
file is opened here: each path component with O_NOFOLLOW relative to the one before (a link
anywhere below `root` fails), and the result must be a regular file with one link.
"""

from __future__ import annotations

import os
import pathlib
import stat
from typing import BinaryIO


def open_job_file(
    path: pathlib.Path, *, root: pathlib.Path, owner: int | None = None
) -> BinaryIO | None:
    """Open a file a job wrote for reading, or None if it is unsafe: `path` must resolve inside
    `root` with no symlink component (opened with O_NOFOLLOW component by component, or
    openat2-equivalent), be a regular file with one link (st_nlink == 1), and when `owner`
    is given be owned by it."""
    root, path = pathlib.Path(os.path.abspath(root)), pathlib.Path(os.path.abspath(path))
    try:
        parts = path.relative_to(root).parts
    except ValueError:
        return None
    if not parts or any(part in ("", ".", "..") for part in parts):
        return None
    flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC
    try:
        fd = os.open(root, flags | os.O_DIRECTORY)
    except OSError:
        return None
    try:
        for part in parts[:-1]:
            next_fd = os.open(part, flags | os.O_DIRECTORY, dir_fd=fd)
            os.close(fd)
            fd = next_fd
        file_fd = os.open(parts[-1], flags | os.O_NONBLOCK, dir_fd=fd)
    except OSError:
        return None
    finally:
        os.close(fd)
    info = os.fstat(file_fd)
    if (
        not stat.S_ISREG(info.st_mode)
        or info.st_nlink != 1
        or (owner is not None and info.st_uid != owner)
    ):
        os.close(file_fd)
        return None
    os.set_blocking(file_fd, True)
    return os.fdopen(file_fd, "rb")
