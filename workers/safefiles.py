"""Open files a job wrote without trusting the job: no symlink anywhere below the root, a
regular file with one link, owned by the job. Pure Python, no Django (the agent imports it)."""

from __future__ import annotations

import os
import pathlib
import stat
from typing import BinaryIO

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
# O_NONBLOCK: a FIFO planted by the job must not hang the agent in open().
_FILE_FLAGS = (
    os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK | getattr(os, "O_NOCTTY", 0)
)


def open_job_file(
    path: str | os.PathLike, *, root: str | os.PathLike, owner: int | None = None
) -> BinaryIO | None:
    """Open a file a job wrote for reading, or None if it is unsafe: `path` must resolve inside
    `root` with no symlink component (opened with O_NOFOLLOW component by component, or
    openat2-equivalent), be a regular file with one link (st_nlink == 1), and when `owner`
    is given be owned by it."""
    parts = _parts_below(path, root)
    if not parts:
        return None
    fd = _walk(root, parts)
    if fd is None:
        return None
    info = os.fstat(fd)
    unsafe = (
        not stat.S_ISREG(info.st_mode)
        or info.st_nlink != 1
        or (owner is not None and info.st_uid != owner)
    )
    if unsafe:
        os.close(fd)
        return None
    os.set_blocking(fd, True)
    return os.fdopen(fd, "rb")


def _parts_below(path: str | os.PathLike, root: str | os.PathLike) -> tuple[str, ...]:
    """The components of `path` under `root`, lexically (no resolving: resolving would follow
    the very links we refuse); empty when it is not strictly inside. On strings: the agent
    opens a job's control files on every tick, and pathlib's parsing cost as much as the opens."""
    path, top = os.path.abspath(path), os.path.abspath(root)
    below = top.rstrip("/") + "/"
    if not path.startswith(below):
        return ()
    parts = tuple(path[len(below) :].split("/"))
    return () if any(part in ("", ".", "..") for part in parts) else parts


def _walk(root: str | os.PathLike, parts: tuple[str, ...]) -> int | None:
    try:
        directory = os.open(root, _DIR_FLAGS)  # the root itself may not be a link either
    except OSError:
        return None
    try:
        for part in parts[:-1]:
            inner = os.open(part, _DIR_FLAGS, dir_fd=directory)
            os.close(directory)
            directory = inner
        return os.open(parts[-1], _FILE_FLAGS, dir_fd=directory)
    except OSError:  # ELOOP (a link), ENOTDIR, ENOENT, EACCES: unsafe or gone, the same to us
        return None
    finally:
        os.close(directory)


def tree_size(root: pathlib.Path) -> int:
    """Bytes under `root`, counting links as themselves (never following one)."""
    total = 0
    for directory, dirnames, filenames in os.walk(root, followlinks=False):
        for name in dirnames + filenames:
            try:
                total += os.lstat(os.path.join(directory, name)).st_size
            except OSError:
                pass
    return total
