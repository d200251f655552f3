"""Pack a working directory into a code bundle: a deterministic `.tar.gz`.

What goes in: every regular file, directory and symbolic link under the directory, except
  - the default excludes (`DEFAULT_EXCLUDES`: `.git/`, `.venv/`, `venv/`, `__pycache__/`,
    `*.pyc`, ...), and
  - whatever the directory's own `.gpuignore` (gitignore syntax, read with pathspec) excludes,
    on top of those; a `!pattern` there can bring back a default-excluded *file* (`!keep.pyc`),
    but, as in git, nothing under an excluded directory.
A symbolic link is stored as a link (never followed) and only if it points inside the
directory; one that points out of it is refused (`PackError`). Sockets, FIFOs and devices are
skipped.

Determinism: entries sorted by path, every mtime the same fixed date, owner root:root with no
names, modes normalised (directories and executables 0755, other files 0644, links 0777), the
gzip header without a name or a date. An unchanged directory gives the same bytes, so the
same sha256, so nothing to upload the second time.
"""

from __future__ import annotations

import dataclasses
import gzip
import hashlib
import io
import os
import pathlib
import stat
import tarfile
import tempfile

import pathspec

IGNORE_FILE = ".gpuignore"
DEFAULT_EXCLUDES = (
    ".git/",
    ".hg/",
    ".svn/",
    ".venv/",
    "venv/",
    "__pycache__/",
    "*.pyc",
    "*.pyo",
    ".mypy_cache/",
    ".pytest_cache/",
    ".ruff_cache/",
    ".ipynb_checkpoints/",
    ".DS_Store",
)
FIXED_MTIME = 315532800  # 1980-01-01T00:00:00Z, the earliest date a zip can hold too


class PackError(Exception):
    pass


@dataclasses.dataclass(frozen=True)
class Bundle:
    path: pathlib.Path  # the .tar.gz (a temporary file unless `out` was given)
    sha256: str
    size: int  # bytes of the archive
    files: int  # regular files and links in it
    unpacked_size: int  # bytes of those files
    names: tuple[str, ...]  # every entry, in archive order (directories end with "/")
    skipped: tuple[str, ...]  # special files left out


def ignore_spec(root: pathlib.Path) -> pathspec.PathSpec:
    lines = list(DEFAULT_EXCLUDES)
    ignore = root / IGNORE_FILE
    if ignore.is_file():
        lines += ignore.read_text(encoding="utf-8", errors="replace").splitlines()
    return pathspec.GitIgnoreSpec.from_lines(lines)


def walk(root: str | os.PathLike) -> tuple[list[tuple[str, pathlib.Path]], list[str]]:
    """The (archive name, path) of every entry to pack, sorted, and the special files skipped."""
    root = pathlib.Path(root)
    if not root.is_dir():
        raise PackError(f"{root}: not a directory")
    root = root.resolve()
    spec = ignore_spec(root)
    entries: list[tuple[str, pathlib.Path]] = []
    skipped: list[str] = []

    def visit(directory: pathlib.Path, prefix: str) -> None:
        with os.scandir(directory) as scan:
            children = sorted(scan, key=lambda e: e.name)
        for child in children:
            name = prefix + child.name
            path = directory / child.name
            mode = child.stat(follow_symlinks=False).st_mode
            if stat.S_ISDIR(mode):
                if spec.match_file(name + "/"):
                    continue
                entries.append((name + "/", path))
                visit(path, name + "/")
            elif spec.match_file(name):
                continue
            elif stat.S_ISLNK(mode):
                _check_link(root, path, name)
                entries.append((name, path))
            elif stat.S_ISREG(mode):
                entries.append((name, path))
            else:
                skipped.append(name)

    visit(root, "")
    return entries, skipped


def _check_link(root: pathlib.Path, path: pathlib.Path, name: str) -> None:
    target = os.readlink(path)
    resolved = pathlib.Path(os.path.normpath(path.parent / target))
    try:
        resolved = resolved.resolve()
    except (OSError, RuntimeError) as error:  # a loop
        raise PackError(f"{name}: symbolic link {target!r} cannot be resolved ({error})") from None
    if resolved != root and root not in resolved.parents:
        raise PackError(
            f"{name}: symbolic link to {target!r} points outside the working directory "
            f"(copy the file in, or add {name!r} to {IGNORE_FILE})"
        )


def _link_target(root: pathlib.Path, path: pathlib.Path) -> str:
    """The link's target, relative (an absolute one inside the tree would not survive unpacking)."""
    target = os.readlink(path)
    if not os.path.isabs(target):
        return target
    return os.path.relpath(pathlib.Path(target).resolve(), path.parent.resolve())


def _info(name: str, *, kind: bytes, mode: int, size: int = 0, link: str = "") -> tarfile.TarInfo:
    info = tarfile.TarInfo(name.rstrip("/") if kind == tarfile.DIRTYPE else name)
    info.type, info.mode, info.size, info.linkname = kind, mode, size, link
    info.mtime, info.uid, info.gid, info.uname, info.gname = FIXED_MTIME, 0, 0, "", ""
    return info


def pack(root: str | os.PathLike, out: str | os.PathLike | None = None) -> Bundle:
    """Write the bundle of `root` to `out` (default: a new temporary file; the caller removes
    it) and return what it holds and its sha256."""
    root = pathlib.Path(root)
    entries, skipped = walk(root)
    root = root.resolve()
    if out is None:
        fd, name = tempfile.mkstemp(prefix="gpuplatform-bundle-", suffix=".tar.gz")
        os.close(fd)
        out = name
    out = pathlib.Path(out)
    files = unpacked = 0
    try:
        with (
            open(out, "wb") as raw,
            gzip.GzipFile(filename="", mode="wb", fileobj=raw, mtime=0, compresslevel=6) as gz,
            tarfile.open(fileobj=gz, mode="w", format=tarfile.PAX_FORMAT) as tar,
        ):
            for name, path in entries:
                if name.endswith("/"):
                    tar.addfile(_info(name, kind=tarfile.DIRTYPE, mode=0o755))
                    continue
                st = path.lstat()
                files += 1
                if stat.S_ISLNK(st.st_mode):
                    link = _link_target(root, path)
                    tar.addfile(_info(name, kind=tarfile.SYMTYPE, mode=0o777, link=link))
                    continue
                mode = 0o755 if st.st_mode & 0o111 else 0o644
                with open(path, "rb") as handle:
                    size = os.fstat(handle.fileno()).st_size
                    info = _info(name, kind=tarfile.REGTYPE, mode=mode, size=size)
                    tar.addfile(info, _Exact(handle, size, name))
                unpacked += size
    except BaseException:
        out.unlink(missing_ok=True)
        raise
    digest = hashlib.sha256()
    with open(out, "rb") as handle:
        while chunk := handle.read(1 << 20):
            digest.update(chunk)
    return Bundle(out, digest.hexdigest(), out.stat().st_size, files, unpacked,
                  tuple(n for n, _ in entries), tuple(skipped))  # fmt: skip


class _Exact(io.RawIOBase):
    """A file read as exactly `size` bytes: one that grows or shrinks while it is packed is an
    error, not a corrupt archive."""

    def __init__(self, handle, size: int, name: str):
        self.handle, self.left, self.name = handle, size, name

    def read(self, n: int = -1) -> bytes:
        n = self.left if n is None or n < 0 else min(n, self.left)
        data = self.handle.read(n)
        if len(data) < n:
            raise PackError(f"{self.name}: changed while it was being packed")
        self.left -= len(data)
        return data


def human(size: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if size < 1024 or unit == "GiB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{size:.1f} GiB"
