"""The platform's Redis always wants a password: the embedded one generates it (kept 0600 under
its dir, never on a command line), REDIS_URL may carry one, and a client without it is refused."""

import os
import pathlib
import signal
import socket
import subprocess
import sys
import urllib.parse

import pytest
import redis
from django.conf import settings

from gpuplatform import embedded_redis

ROOT = pathlib.Path(__file__).resolve().parents[2]


def raw_reply(url: str, command: bytes) -> bytes:
    """What the server at `url` answers a client that sends `command` without authenticating."""
    parts = urllib.parse.urlsplit(url)
    with socket.create_connection((parts.hostname, parts.port or 6379), timeout=5) as sock:
        sock.sendall(command)
        return sock.recv(200)


def test_the_test_runs_redis_refuses_a_client_without_credentials():
    url = settings.REDIS_URL
    if not urllib.parse.urlsplit(url).password:
        pytest.skip(
            f"this run's REDIS_URL carries no password ({url}); the default (embedded) and CI's have one"
        )
    if url.startswith("rediss://"):
        pytest.skip("a TLS REDIS_URL: the plain-socket probe cannot speak it")
    for command in (b"PING\r\n", b"GET anything\r\n", b"LPOP node.any\r\n", b"FLUSHALL\r\n"):
        assert raw_reply(url, command).startswith(b"-NOAUTH")
    with pytest.raises(redis.AuthenticationError):
        redis.Redis.from_url(
            url.replace(urllib.parse.urlsplit(url).netloc.split("@")[0] + "@", "")
        ).ping()
    assert redis.Redis.from_url(url).ping()  # and the platform's own URL gets in


def test_the_platforms_clients_use_the_password_from_redis_url():
    from apps.admission import buckets
    from apps.scheduling import redis as scheduling_redis
    from gpuplatform import health

    assert scheduling_redis.client().ping()
    assert buckets.client().ping()
    assert health._redis_ok()


def test_the_embedded_redis_keeps_its_password_private_and_off_the_command_line(tmp_path):
    server = embedded_redis.start(tmp_path / "redis", persist=False)
    try:
        assert urllib.parse.urlsplit(server.url).password == server.password
        assert embedded_redis.discover_url(tmp_path / "redis") == server.url
        for name in (
            embedded_redis.PASSWORD_FILE,
            embedded_redis.URL_FILE,
            embedded_redis.ACL_FILE,
        ):
            assert (tmp_path / "redis" / name).stat().st_mode & 0o777 == 0o600, name
        assert (tmp_path / "redis").stat().st_mode & 0o777 == 0o700
        assert server.password not in (tmp_path / "redis" / embedded_redis.ACL_FILE).read_text()
        cmdline = pathlib.Path(f"/proc/{server.process.pid}/cmdline").read_bytes()
        assert server.password.encode() not in cmdline
        assert raw_reply(server.url, b"PING\r\n").startswith(b"-NOAUTH")
        redis.Redis.from_url(server.url).set("kept", "1")
    finally:
        server.stop()
    again = embedded_redis.start(tmp_path / "redis", persist=False)  # same dir: same password
    try:
        assert again.password == server.password
        assert redis.Redis.from_url(again.url).ping()
    finally:
        again.stop()


def test_python_m_embedded_redis_exits_cleanly_on_sigterm(tmp_path):
    env = dict(os.environ, GPUPLATFORM_DATA_DIR=str(tmp_path), PYTHONPATH=str(ROOT))
    process = subprocess.Popen([sys.executable, "-m", "gpuplatform.embedded_redis"], cwd=ROOT, env=env,
                               stdout=subprocess.PIPE, text=True)  # fmt: skip
    try:
        assert "embedded redis on" in process.stdout.readline()
        url = embedded_redis.discover_url(tmp_path / "redis")
        port = urllib.parse.urlsplit(url).port
        assert redis.Redis.from_url(url).ping()
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=60) == 0  # it hung here: Popen.wait inside the interrupted wait
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    assert not embedded_redis.ping(port)  # the server went with it
    assert embedded_redis.discover_url(tmp_path / "redis") is None


def test_users_saved_with_acl_save_survive_a_restart_of_the_embedded_redis(tmp_path):
    """The nodes' broker users (apps/nodes/broker.py runs ACL SAVE) outlive a restart, even one
    that loses every key (persist=False, as the chaos run's Redis restarts do)."""
    server = embedded_redis.start(tmp_path / "redis", persist=False)
    try:
        admin = redis.Redis.from_url(server.url)
        admin.execute_command(
            "ACL", "SETUSER", "gpuplatform-node-x", "on", ">node-pw", "~node.x", "+llen"
        )
        admin.execute_command("ACL", "SAVE")
        server.process.kill()
    finally:
        server.stop()
    again = embedded_redis.start(tmp_path / "redis", port=server.port, persist=False)
    try:
        node = redis.Redis(port=again.port, username="gpuplatform-node-x", password="node-pw")
        assert node.llen("node.x") == 0
        with pytest.raises(redis.exceptions.NoPermissionError):
            node.llen("node.y")
        assert redis.Redis.from_url(again.url).ping()  # the platform's password unchanged
    finally:
        again.stop()
