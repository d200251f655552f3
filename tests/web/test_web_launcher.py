"""The web's launcher (gpuplatform/web.py): N gunicorn masters of one worker each on one port
through SO_REUSEPORT, so the kernel spreads connections that arrive together over the workers
(one master's workers share one socket, and uvloop's accept takes every pending connection at
once). Real processes: the launcher, gunicorn and the Procfile's worker."""

import os
import pathlib
import signal
import socket
import subprocess
import sys
import time

import psutil
import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def launch(tmp_path, *args: str, **kwargs) -> subprocess.Popen:
    env = dict(os.environ, GPUPLATFORM_DATA_DIR=str(tmp_path))
    env.setdefault("SECRET_KEY", "launcher-test-not-a-secret")
    return subprocess.Popen([sys.executable, "-m", "gpuplatform.web", *args], cwd=ROOT, env=env,
                            start_new_session=True, **kwargs)  # fmt: skip


def listening(port: int) -> list[psutil.Process]:
    """The processes with a socket listening on `port`."""
    found = []
    for process in psutil.process_iter():
        try:
            if any(c.status == psutil.CONN_LISTEN and c.laddr.port == port
                   for c in process.net_connections("tcp")):  # fmt: skip
                found.append(process)
        except psutil.Error:
            continue
    return found


def wait_for(predicate, what: str, timeout: float = 60):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


def masters_and_workers(web: subprocess.Popen) -> tuple[list[psutil.Process], list[psutil.Process]]:
    masters = psutil.Process(web.pid).children()
    return masters, [w for m in masters for w in m.children()]


def ask(port: int) -> socket.socket:
    """A connection that has had one answer (so a worker has accepted it), left open."""
    connection = socket.create_connection(("127.0.0.1", port), timeout=30)
    connection.sendall(b"GET /no-such-page/ HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
    head = b""
    while b"\r\n\r\n" not in head:
        chunk = connection.recv(4096)
        assert chunk, "the web closed the connection without an answer"
        head += chunk
    assert head.startswith(b"HTTP/1.1 "), head[:100]
    return connection


@pytest.fixture
def web(tmp_path):
    port = free_port()
    process = launch(tmp_path, "--bind", f"127.0.0.1:{port}", "--workers", "2", "--threads", "1")
    process.port = port
    try:
        # both masters' workers listen (each inherits its master's socket)
        wait_for(lambda: len(masters_and_workers(process)[1]) == 2 and len(listening(port)) >= 4,
                 "two masters, each with its worker, listening")  # fmt: skip
        yield process
    finally:
        try:  # the whole group: a master or worker a test left behind too
            os.killpg(process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        process.wait(30)


def test_connections_that_arrive_together_are_spread_over_both_workers(web):
    connections = [ask(web.port) for _ in range(16)]
    try:
        _, workers = masters_and_workers(web)
        held = [
            sum(1 for c in w.net_connections("tcp")
                if c.status == psutil.CONN_ESTABLISHED and c.laddr.port == web.port)
            for w in workers
        ]  # fmt: skip
        # by address hash: all 16 on one of two sockets has a chance of 2 in 65,536
        assert sum(held) == 16 and min(held) > 0, held
    finally:
        for connection in connections:
            connection.close()


def test_sigterm_stops_every_master_and_exits_cleanly(web):
    masters, workers = masters_and_workers(web)
    web.send_signal(signal.SIGTERM)
    assert web.wait(60) == 0
    assert not any(p.is_running() and p.status() != psutil.STATUS_ZOMBIE for p in masters + workers)


def test_a_master_that_dies_takes_the_web_down_rather_than_leave_it_half(web):
    masters, workers = masters_and_workers(web)
    masters[0].kill()
    assert web.wait(60) != 0
    wait_for(lambda: not masters[1].is_running() or masters[1].status() == psutil.STATUS_ZOMBIE,
             "the other master stopped")  # fmt: skip


def test_an_address_another_web_listens_on_is_refused_not_shared(tmp_path):
    # what a second platform's web (the same user, SO_REUSEPORT) would hold
    with socket.socket() as other:
        other.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        other.bind(("127.0.0.1", 0))
        other.listen()
        port = other.getsockname()[1]
        web = launch(tmp_path, "--bind", f"127.0.0.1:{port}", stderr=subprocess.PIPE, text=True)
        _, err = web.communicate(timeout=60)
    assert web.returncode == 2
    assert f"the web's address 127.0.0.1:{port} is taken" in err


def test_a_unix_socket_cannot_be_shared_by_several_masters(tmp_path):
    web = launch(tmp_path, "--bind", f"unix:{tmp_path}/web.sock", "--workers", "2",
                 stderr=subprocess.PIPE, text=True)  # fmt: skip
    _, err = web.communicate(timeout=60)
    assert web.returncode == 2
    assert "--bind: a unix socket" in err and "--workers 1" in err


@pytest.mark.parametrize(
    ("bind", "expected"),
    [("127.0.0.1:8000", ("127.0.0.1", 8000)), ("[::1]:9000", ("::1", 9000)),
     ("localhost", ("localhost", 8000)), (":8001", ("0.0.0.0", 8001))],
)  # fmt: skip
def test_gunicorn_s_tcp_bind_forms_are_read(bind, expected):
    from gpuplatform.web import host_port

    assert host_port(bind) == expected
