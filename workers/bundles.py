"""The node's cache of code bundles, keyed by their sha256, under the agent's data dir.

`<data dir>/bundles/<sha256>` holds an archive as the agent API sent it, verified against its
digest, read-only (0400, the agent's: jobs never reach the data dir; they get an unpacked copy in
their work dir, workers/unpack.py). A lock file per digest (`locks/<sha256>.lock`, fcntl.flock)
keeps an entry in use: every user of the entry holds it shared for as long as its member runs
(from before it looks for the entry), and eviction takes it exclusively without waiting, so an
entry in use is never evicted. A second lock file (`locks/<sha256>.fetch`), held exclusively for
a download, makes concurrent fetches of one digest download once; the others wait for that
download only, never for a member's run. The cache is size-capped
(GPUPLATFORM_BUNDLE_CACHE_MIB, default 10240): after each fetch the least recently used
entries (by mtime, touched at each use) that nobody holds go until the rest fits.
Pure Python, no Django.
"""

from __future__ import annotations

import fcntl
import hashlib
import logging
import os
import pathlib
import re
import tempfile
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from workers.isolation import env_int

log = logging.getLogger(__name__)
DIGEST = re.compile(r"[0-9a-f]{64}")


class FetchError(Exception):
    """The bundle could not be had: `final` when fetching again cannot help (it is gone, or not
    what its digest says twice over is unlikely: a mismatch is reported, and retried)."""

    def __init__(self, message: str, *, final: bool):
        super().__init__(message)
        self.final = final


@dataclass
class Lease:
    """One member's use of a cached archive: held (a shared lock) until released."""

    digest: str
    path: pathlib.Path
    fetched: int | None  # bytes downloaded for this use; None: it was in the cache
    fd: int

    def release(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)  # drops the shared lock
            self.fd = -1


class BundleCache:
    def __init__(self, root: pathlib.Path, cap_bytes: int | None = None):
        self.root = root
        self.cap = (
            cap_bytes
            if cap_bytes is not None
            else env_int("GPUPLATFORM_BUNDLE_CACHE_MIB", 10240, minimum=1) * 2**20
        )
        self.locks = root / "locks"
        self.locks.mkdir(parents=True, exist_ok=True, mode=0o700)
        root.chmod(0o700)

    def path(self, digest: str) -> pathlib.Path:
        return self.root / digest

    def acquire(self, digest: str, fetch: Callable[[], Iterable[bytes]]) -> Lease:
        """The archive of `digest`, fetched with `fetch()` (its chunks) unless it is here already,
        and held until the lease is released."""
        if not DIGEST.fullmatch(digest):
            raise FetchError(f"bad bundle digest {digest!r}", final=True)
        fd = os.open(self.locks / f"{digest}.lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            fetched = None
            fcntl.flock(fd, fcntl.LOCK_SH)  # in use from here to the release: eviction passes it by
            if not self.path(digest).exists():
                # One fetcher at a time, on a lock of its own: the others wait for the download
                # only, then find it here. (Waiting for the use lock exclusively instead would
                # wait for the first fetcher's member to end, as that holds it shared.)
                with open(self.locks / f"{digest}.fetch", "a") as fetching:
                    fcntl.flock(fetching, fcntl.LOCK_EX)
                    if not self.path(digest).exists():
                        fetched = self._download(digest, fetch)
            os.utime(self.path(digest))  # used now: the last to be evicted
        except BaseException:
            os.close(fd)
            raise
        lease = Lease(digest=digest, path=self.path(digest), fetched=fetched, fd=fd)
        if fetched is not None:
            self.evict()
        return lease

    def _download(self, digest: str, fetch: Callable[[], Iterable[bytes]]) -> int:
        hasher, size = hashlib.sha256(), 0
        fd, tmp = tempfile.mkstemp(dir=self.root, prefix=".download.")
        try:
            with os.fdopen(fd, "wb") as out:
                for chunk in fetch():
                    hasher.update(chunk)
                    size += len(chunk)
                    out.write(chunk)
            got = hasher.hexdigest()
            if got != digest:
                raise FetchError(f"the bundle fetched has sha256 {got[:12]}..., not {digest[:12]}...",
                                 final=False)  # fmt: skip
            os.chmod(tmp, 0o400)
            os.replace(tmp, self.path(digest))
        except BaseException:
            pathlib.Path(tmp).unlink(missing_ok=True)
            raise
        return size

    def entries(self) -> list[pathlib.Path]:
        return [path for path in self.root.iterdir() if DIGEST.fullmatch(path.name)]

    def size(self) -> int:
        return sum(_size(path) for path in self.entries())

    def evict(self) -> list[str]:
        """Drop least recently used entries nobody holds until the cache fits its cap."""
        evicted: list[str] = []
        with open(self.locks / ".evict", "a") as guard:
            fcntl.flock(guard, fcntl.LOCK_EX)
            entries = sorted(self.entries(), key=_mtime)
            sizes = {path.name: _size(path) for path in entries}
            total = sum(sizes.values())
            for path in entries:
                if total <= self.cap:
                    break
                if self._remove_unless_used(path):
                    total -= sizes[path.name]
                    evicted.append(path.name)
        for name in evicted:
            log.info("bundle cache: evicted %s (over %d MiB)", name[:12], self.cap // 2**20)
        return evicted

    def _remove_unless_used(self, path: pathlib.Path) -> bool:
        fd = os.open(self.locks / f"{path.name}.lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                return False  # a member uses it, or it is being fetched
            path.unlink(missing_ok=True)
            return True
        finally:
            os.close(fd)


def _mtime(path: pathlib.Path) -> float:
    try:
        return path.stat().st_mtime
    except FileNotFoundError:
        return 0.0


def _size(path: pathlib.Path) -> int:
    try:
        return path.stat().st_size
    except FileNotFoundError:
        return 0
