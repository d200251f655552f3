"""Unpack a job's code bundle (.tar.gz or .zip, told apart by their magic bytes) into its work dir
without trusting it: the agent may be root, so no entry may write, or link, outside the tree.

Each entry is checked and written one by one, counting as it goes (a bomb stops at the first
entry past a cap, never after unpacking it): no absolute path, no `..`, no entry written through
a link (every directory below the root is opened with O_NOFOLLOW), no symbolic link whose target
leaves the tree, hard links only to a file already unpacked (copied, so no file in the tree has
two names), no device files, FIFOs or sparse files, the unpacked bytes and the entry count capped.
Pure Python, no Django (the agent imports it).
"""

from __future__ import annotations

import errno
import os
import pathlib
import posixpath
import shutil
import stat
import tarfile
import zipfile
import zlib
from dataclasses import dataclass

from workers.isolation import env_int

GZIP_MAGIC = b"\x1f\x8b"
ZIP_MAGICS = (b"PK\x03\x04", b"PK\x05\x06")  # a zip with entries; an empty one
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
COPY_CHUNK = 1 << 20


class Refused(Exception):
    """The bundle is not unpacked: why, for the attempt's reason (`bundle: member R: <why>`)."""


@dataclass(frozen=True)
class Caps:
    max_bytes: int
    max_files: int

    @classmethod
    def from_env(cls) -> Caps:
        return cls(
            max_bytes=env_int("GPUPLATFORM_BUNDLE_MAX_UNPACKED_MIB", 2048, minimum=1) * 2**20,
            max_files=env_int("GPUPLATFORM_BUNDLE_MAX_FILES", 100_000, minimum=1),
        )


def archive_kind(path: pathlib.Path) -> str:
    """ "tar.gz" or "zip", by the file's first bytes (never its name or a header it was sent with)."""
    with open(path, "rb") as handle:
        head = handle.read(4)
    if head.startswith(GZIP_MAGIC):
        return "tar.gz"
    if head in ZIP_MAGICS:
        return "zip"
    raise Refused("not a .tar.gz or .zip archive")


def unpack(archive: pathlib.Path, dest: pathlib.Path, caps: Caps) -> int:
    """Unpack `archive` into the existing dir `dest`; the number of entries. Raises Refused
    (what was written stays inside `dest`: the caller removes it)."""
    kind = archive_kind(archive)
    tree = _Tree(dest, caps)
    try:
        if kind == "zip":
            _unpack_zip(archive, tree)
        else:
            _unpack_tar(archive, tree)
        tree.check_links()
    finally:
        tree.close()
    return tree.files


def _clean(name: str) -> str:
    """The entry's path relative to the root, or Refused: never absolute, never `..`."""
    if "\0" in name:
        raise Refused(f"entry {name!r} has a NUL in its name")
    if name.startswith("/") or (len(name) > 1 and name[1] == ":" and name[0].isalpha()):
        raise Refused(f"entry {name!r} is an absolute path")
    parts = [part for part in name.split("/") if part not in ("", ".")]
    if ".." in parts:
        raise Refused(f"entry {name!r} leaves the work dir")
    return "/".join(parts)


class _Tree:
    """The work dir being filled: every write goes through dir fds opened without following links."""

    def __init__(self, root: pathlib.Path, caps: Caps):
        self.caps, self.files, self.bytes = caps, 0, 0
        self.root_fd = os.open(root, _DIR_FLAGS)
        self.links: list[tuple[str, str]] = []  # (entry, target): checked again once all is there
        self.regular: set[str] = set()  # files unpacked: hard links may point only at these

    def close(self) -> None:
        os.close(self.root_fd)

    def count(self, name: str) -> None:
        self.files += 1
        if self.files > self.caps.max_files:
            raise Refused(f"more than {self.caps.max_files} entries (at {name!r})")

    def _add_bytes(self, name: str, size: int) -> None:
        self.bytes += size
        if self.bytes > self.caps.max_bytes:
            raise Refused(f"unpacks to more than {self.caps.max_bytes // 2**20} MiB (at {name!r})")

    def _parent(self, path: str, name: str) -> int:
        """An fd of the entry's parent dir, made as needed; Refused if a link is on the way."""
        fd = os.dup(self.root_fd)
        try:
            for part in path.split("/")[:-1]:
                try:
                    os.mkdir(part, 0o755, dir_fd=fd)
                except FileExistsError:
                    pass
                try:
                    inner = os.open(part, _DIR_FLAGS, dir_fd=fd)
                except OSError as error:
                    if error.errno in (errno.ELOOP, errno.ENOTDIR):
                        raise Refused(f"entry {name!r} passes through a link or a file") from None
                    raise
                os.close(fd)
                fd = inner
        except BaseException:
            os.close(fd)
            raise
        return fd

    def directory(self, name: str) -> None:
        path = _clean(name)
        self.count(name)
        if not path:
            return
        parent = self._parent(path, name)
        leaf = path.rsplit("/", 1)[-1]
        try:
            try:
                os.mkdir(leaf, 0o755, dir_fd=parent)
            except FileExistsError:
                if not stat.S_ISDIR(os.lstat(leaf, dir_fd=parent).st_mode):
                    raise Refused(f"entry {name!r} is a dir and a file or link") from None
        finally:
            os.close(parent)

    def file(self, name: str, source, size: int, mode: int) -> None:
        """A regular file from `source` (a binary reader), `size` bytes by its header."""
        path = _clean(name)
        self.count(name)
        if not path:
            raise Refused(f"entry {name!r} has no name")
        if size > self.caps.max_bytes - self.bytes:
            self._add_bytes(name, size)  # says so before a byte is read
        parent = self._parent(path, name)
        leaf = path.rsplit("/", 1)[-1]
        try:
            flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
            try:
                fd = os.open(leaf, flags, _file_mode(mode), dir_fd=parent)
            except FileExistsError:
                raise Refused(f"entry {name!r} appears twice") from None
            with os.fdopen(fd, "wb") as out:
                while chunk := source.read(COPY_CHUNK):
                    self._add_bytes(name, len(chunk))  # what it really holds, whatever it said
                    out.write(chunk)
        finally:
            os.close(parent)
        self.regular.add(path)

    def symlink(self, name: str, target: str) -> None:
        path = _clean(name)
        self.count(name)
        if not path:
            raise Refused(f"entry {name!r} has no name")
        if not _inside(path, target):
            raise Refused(f"entry {name!r} is a link out of the work dir ({target!r})")
        parent = self._parent(path, name)
        try:
            os.symlink(target, path.rsplit("/", 1)[-1], dir_fd=parent)
        except FileExistsError:
            raise Refused(f"entry {name!r} appears twice") from None
        finally:
            os.close(parent)
        self.links.append((path, target))

    def hardlink(self, name: str, target: str) -> None:
        """A copy of a file unpacked before it (never a second name for one: see _give)."""
        try:
            source_path = _clean(target)
        except Refused:
            raise Refused(
                f"entry {name!r} is a hard link out of the work dir ({target!r})"
            ) from None
        if source_path not in self.regular:
            raise Refused(f"entry {name!r} is a hard link out of the work dir ({target!r})")
        parent = self._parent(source_path, name)
        try:
            fd = os.open(source_path.rsplit("/", 1)[-1], os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC,
                         dir_fd=parent)  # fmt: skip
        finally:
            os.close(parent)
        with os.fdopen(fd, "rb") as source:
            info = os.fstat(source.fileno())
            self.file(name, source, info.st_size, info.st_mode)

    def check_links(self) -> None:
        """Every link resolved on the finished tree lands inside it (a chain of links, each
        inside on its own, may still lead out through a `..` after a link)."""
        root = os.path.realpath(f"/proc/self/fd/{self.root_fd}")
        for path, target in self.links:
            resolved = os.path.realpath(os.path.join(root, path))
            if resolved != root and not resolved.startswith(root.rstrip("/") + "/"):
                raise Refused(f"entry {path!r} is a link out of the work dir ({target!r})")


def _inside(path: str, target: str) -> bool:
    """Lexically: the link at `path` (relative to the root) points inside the root."""
    if not target or target.startswith("/") or "\0" in target:
        return False
    joined = posixpath.normpath(posixpath.join(posixpath.dirname(path), target))
    return joined != ".." and not joined.startswith("../") and not joined.startswith("/")


def _file_mode(mode: int) -> int:
    """rw for the owner, read for the rest, exec where the archive had any: never setuid, setgid
    or sticky, never writable by others."""
    return 0o755 if mode & 0o111 else 0o644


# --- the two formats ------------------------------------------------------------------------------


def _unpack_tar(archive: pathlib.Path, tree: _Tree) -> None:
    try:
        with tarfile.open(archive, mode="r|gz") as tar:  # a stream: one entry at a time
            while (member := tar.next()) is not None:
                _checked(_tar_entry, tar, member, tree, name=member.name)
                tar.members.clear()  # a stream keeps every header otherwise: 100000 of them
    except (tarfile.TarError, EOFError, zlib.error, OSError) as error:
        if isinstance(error, OSError) and error.errno not in (None, errno.EINVAL):
            raise
        raise Refused(f"not a valid .tar.gz: {error}") from None


def _checked(write, archive, entry, tree: _Tree, *, name: str) -> None:
    """Write one entry; a name the file system will not take is the bundle's fault, not the
    node's (a full disk or any other trouble stays an OSError: the platform retries that)."""
    try:
        write(archive, entry, tree)
    except OSError as error:
        if error.errno in (errno.ENAMETOOLONG, errno.EILSEQ, errno.EINVAL):
            raise Refused(f"entry {name[:200]!r} cannot be written: {error.strerror}") from None
        raise


def _tar_entry(tar: tarfile.TarFile, member: tarfile.TarInfo, tree: _Tree) -> None:
    name = member.name
    if member.ischr() or member.isblk():
        raise Refused(f"entry {name!r} is a device file")
    if member.isfifo():
        raise Refused(f"entry {name!r} is a FIFO")
    if member.issparse():
        raise Refused(f"entry {name!r} is a sparse file")
    if member.isdir():
        tree.directory(name)
    elif member.issym():
        tree.symlink(name, member.linkname)
    elif member.islnk():
        tree.hardlink(name, member.linkname)
    elif member.isreg():
        source = tar.extractfile(member)
        assert source is not None  # a regular file always has a reader
        tree.file(name, source, member.size, member.mode)
    else:
        raise Refused(f"entry {name!r} is of an unknown type")


def _unpack_zip(archive: pathlib.Path, tree: _Tree) -> None:
    try:
        with zipfile.ZipFile(archive) as bundle:
            for info in bundle.infolist():
                _checked(_zip_entry, bundle, info, tree, name=info.filename)
    except (zipfile.BadZipFile, zipfile.LargeZipFile, EOFError, NotImplementedError) as error:
        raise Refused(f"not a valid .zip: {error}") from None


def _zip_entry(bundle: zipfile.ZipFile, info: zipfile.ZipInfo, tree: _Tree) -> None:
    name = info.filename
    mode = (info.external_attr >> 16) & 0xFFFF  # the Unix mode, where a Unix zip wrote one
    kind = stat.S_IFMT(mode)
    if kind in (stat.S_IFCHR, stat.S_IFBLK):
        raise Refused(f"entry {name!r} is a device file")
    if kind == stat.S_IFIFO:
        raise Refused(f"entry {name!r} is a FIFO")
    if kind == stat.S_IFSOCK:
        raise Refused(f"entry {name!r} is a socket")
    if info.is_dir():
        tree.directory(name)
    elif kind == stat.S_IFLNK:
        if info.file_size > 4096:
            raise Refused(f"entry {name!r} is a link with a {info.file_size}-byte target")
        with bundle.open(info) as source:
            target = source.read(4097).decode("utf-8", errors="replace")
        tree.symlink(name, target)
    else:
        with bundle.open(info) as source:
            tree.file(name, source, info.file_size, mode)


def clear(dest: pathlib.Path) -> None:
    """Remove what a refused bundle left in `dest` (links are removed, never followed)."""
    for child in list(dest.iterdir()) if dest.is_dir() else []:
        if child.is_dir() and not child.is_symlink():
            shutil.rmtree(child, ignore_errors=True)
        else:
            child.unlink(missing_ok=True)
