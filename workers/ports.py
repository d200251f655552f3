"""MASTER_PORT: a port leased by the agent of the member that listens on it (rank 0), unique on
its host while the member runs, and checked free; the other members of a gang learn it from the
platform (rank 0's start report carries it; their agents wait for it before they start them).

A lease is a lock (flock) held on `<lock dir>/<port>.lock` for as long as the member runs: given
back at its end, and by the kernel when the agent dies, however it dies, so a port is never held
for a job that is gone. Every agent of a host shares the lock dir, so two agents on one host (a
test run, a host with two agents) never hand out one port twice. A port is leased only if
nothing listens on it either (a bind check): the host's own services, a job's child left over.

Settings (the agent's environment): GPUPLATFORM_MASTER_PORTS, the range (`29500-29999`);
GPUPLATFORM_PORT_LOCK_DIR (`/run/gpuplatform/ports` for root, else under the temp dir).
"""

from __future__ import annotations

import errno
import fcntl
import os
import pathlib
import socket
import tempfile
import threading

DEFAULT_RANGE = (29500, 29999)


class NoFreePort(Exception):
    """Every port of the range is leased or taken."""


def port_range(environ=os.environ) -> tuple[int, int]:
    raw = environ.get("GPUPLATFORM_MASTER_PORTS", "").strip()
    if not raw:
        return DEFAULT_RANGE
    first, _, last = raw.partition("-")
    low, high = int(first), int(last or first)
    if not 1024 <= low <= high <= 65535:
        raise ValueError(
            f"GPUPLATFORM_MASTER_PORTS must be LOW-HIGH within 1024-65535, not {raw!r}"
        )
    return low, high


def lock_dir(environ=os.environ) -> pathlib.Path:
    configured = environ.get("GPUPLATFORM_PORT_LOCK_DIR", "").strip()
    if configured:
        return pathlib.Path(configured)
    if os.geteuid() == 0:
        return pathlib.Path("/run/gpuplatform/ports")
    return pathlib.Path(tempfile.gettempdir()) / f"gpuplatform-ports-{os.geteuid()}"


def _free(port: int) -> bool:
    """Nothing listens on the port (nor holds it in TIME_WAIT) on any address of the host."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        try:
            probe.bind(("0.0.0.0", port))  # noqa: S104 (a probe, closed at once)
        except OSError as error:
            if error.errno in (errno.EADDRINUSE, errno.EACCES):
                return False
            raise
    return True


class PortLeases:
    def __init__(self, directory: pathlib.Path | None = None, ports: tuple[int, int] | None = None):
        self.directory = directory or lock_dir()
        self.first, self.last = ports or port_range()
        try:
            self.directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        except OSError:  # no /run (a bare container): every agent of the host falls back alike
            if directory is not None:
                raise
            self.directory = (
                pathlib.Path(tempfile.gettempdir()) / f"gpuplatform-ports-{os.geteuid()}"
            )
            self.directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        self._held: dict[int, int] = {}  # port -> the lock file's fd
        self._lock = threading.Lock()
        self._next = 0  # round robin: a port just given back rests while others are free

    def lease(self) -> int:
        """A port of the range no one else holds and nothing listens on; NoFreePort if none."""
        span = self.last - self.first + 1
        with self._lock:
            for step in range(span):
                port = self.first + (self._next + step) % span
                if port in self._held:
                    continue
                fd = os.open(
                    self.directory / f"{port}.lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600
                )
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    os.close(fd)
                    continue
                if not _free(port):
                    os.close(fd)  # the lock goes with it
                    continue
                self._held[port] = fd
                self._next = (port - self.first + 1) % span
                return port
        raise NoFreePort(f"no free port for MASTER_PORT in {self.first}-{self.last}")

    def release(self, port: int) -> None:
        with self._lock:
            fd = self._held.pop(port, None)
        if fd is not None:
            os.close(fd)

    def held(self) -> set[int]:
        with self._lock:
            return set(self._held)

    def held_fds(self) -> list[int]:
        """The lock files' descriptors (a test closes them as a dying agent's are closed)."""
        with self._lock:
            return list(self._held.values())
