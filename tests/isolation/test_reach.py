"""A fenced job cannot read what is not its own: the agent's environment, the control plane's
database and storage, another job's dirs and /tmp; and cannot signal another job."""

import os
import shutil
import uuid

import pytest

from tests.isolation.conftest import (
    finish,
    launch,
    outside_private_tmp,
    report,
    result_of,
    wait_for_line,
)
from tests.processes import alive

TRY_READ = """
def attempt(what, action):
    try:
        action()
        result[what] = "read"
    except OSError as error:
        result[what] = type(error).__name__
"""


def test_a_job_cannot_read_the_agents_environment(runner, monkeypatch):
    monkeypatch.setenv("SECRET_KEY", "agent-secret-do-not-leak")
    code = report(TRY_READ + f"attempt('environ', lambda: open('/proc/{os.getpid()}/environ', 'rb').read())\n"
                  "result['uid'] = os.getuid()\nresult['leak'] = 'agent-secret' in str(os.environ)")  # fmt: skip
    key = launch(runner, code)
    assert finish(runner, key)[1] == 0
    seen = result_of(runner, key)
    assert seen["environ"] == "PermissionError"
    assert seen["uid"] != 0 and seen["leak"] is False


@pytest.fixture
def control_plane(monkeypatch):
    """A control plane's data dir as `make run` lays it out (gpuplatform.launch), somewhere a
    job could otherwise walk to: beside the code (outside_private_tmp)."""
    from gpuplatform import launch as platform_launch

    path = outside_private_tmp() / f".isolation-test-var-{uuid.uuid4().hex[:8]}"
    monkeypatch.setenv("GPUPLATFORM_DATA_DIR", str(path))
    data = platform_launch.data_dir()
    (data / "db.sqlite3").write_text("every user's API token")
    (data / "db.sqlite3").chmod(0o600)
    storage = data / "storage" / "artifacts"
    storage.mkdir(parents=True)
    (storage / "result.json").write_text("another tenant's result")
    (storage / "result.json").chmod(0o644)  # even a world-readable file behind the 0700 dir
    yield data
    shutil.rmtree(data)


def test_a_job_cannot_read_the_control_planes_database_or_storage(runner, control_plane):
    assert control_plane.stat().st_mode & 0o777 == 0o700
    code = report(TRY_READ + f"attempt('database', lambda: open({str(control_plane / 'db.sqlite3')!r}).read())\n"
                  f"attempt('storage', lambda: os.listdir({str(control_plane / 'storage')!r}))\n"
                  f"attempt('file', lambda: open({str(control_plane / 'storage/artifacts/result.json')!r}).read())")  # fmt: skip
    key = launch(runner, code)
    assert finish(runner, key)[1] == 0
    assert result_of(runner, key) == {
        "database": "PermissionError",
        "storage": "PermissionError",
        "file": "PermissionError",
    }


def test_a_job_cannot_reach_another_jobs_dirs_or_tmp(runner):
    victim = launch(runner, report(
        "from gpuplatform_job import output_dir, checkpoint_dir\n"
        "for d in (os.getcwd(), output_dir(), checkpoint_dir(), '/tmp'):\n"
        "    open(os.path.join(d, 'secret.txt'), 'w').write('victim data')\n"
        "result['dirs'] = [os.getcwd(), str(output_dir()), str(checkpoint_dir())]\n"
        "print('RESULT', json.dumps(result), flush=True)\nimport time; time.sleep(60)"))  # fmt: skip
    wait_for_line(runner, victim, "RESULT")
    dirs = result_of(runner, victim)["dirs"]
    paths = [os.path.join(d, "secret.txt") for d in dirs] + [
        "/tmp/secret.txt",
        str(runner.runs[victim].log_path),
    ]
    attacker = launch(runner, report(TRY_READ + "\n".join(
        f"attempt({p!r}, lambda: open({p!r}).read())" for p in paths) +
        f"\nattempt('write', lambda: open({os.path.join(dirs[1], 'planted.txt')!r}, 'w').write('x'))"))  # fmt: skip
    assert finish(runner, attacker)[1] == 0
    seen = result_of(runner, attacker)
    assert all(outcome != "read" for outcome in seen.values()), seen
    assert not os.path.exists(os.path.join(dirs[1], "planted.txt"))
    for d in dirs:  # the victim's own dirs: 0700 and its own
        info = os.stat(d)
        assert info.st_mode & 0o777 == 0o700 and info.st_uid == runner.runs[victim].uid


def test_a_job_cannot_signal_another_jobs_processes_or_the_agent(runner):
    victim = launch(
        runner, "import os, time; print('PID', os.getpid(), flush=True); time.sleep(60)"
    )
    victim_pid = int(wait_for_line(runner, victim, "PID"))
    attacker = launch(runner, report(
        "def hit(pid, sig):\n"
        "    try:\n        os.kill(pid, sig)\n        return 'sent'\n"
        "    except OSError as error:\n        return type(error).__name__\n"
        f"result['victim'] = hit({victim_pid}, 9)\nresult['agent'] = hit({os.getpid()}, 15)\n"
        f"result['group'] = hit(-{victim_pid}, 9)"))  # fmt: skip
    assert finish(runner, attacker)[1] == 0
    assert result_of(runner, attacker) == {
        "victim": "PermissionError",
        "agent": "PermissionError",
        "group": "PermissionError",
    }
    assert alive(victim_pid)
    runner.stop(*victim, "cancel")
    assert finish(runner, victim)[2] == "cancel"


def test_members_running_at_once_each_have_their_own_uid_and_no_supplementary_groups(runner):
    code = report("result.update(uid=os.getuid(), gid=os.getgid(), groups=os.getgroups(), euid=os.geteuid())\n"
                  "print('RESULT', json.dumps(result), flush=True)\nimport time; time.sleep(60)")  # fmt: skip
    first, second = launch(runner, code), launch(runner, code)
    wait_for_line(runner, first, "RESULT"), wait_for_line(runner, second, "RESULT")
    a, b = result_of(runner, first), result_of(runner, second)
    assert a["uid"] != 0 and a["uid"] == a["gid"] == a["euid"] and a["groups"] == []
    assert b["uid"] != a["uid"] and b["gid"] != a["gid"]


def test_a_job_cannot_use_the_broker_without_credentials(runner):
    """The test run's Redis has a password (tests/services_plugin.py) that the job is never given:
    it reaches the port, and every command it sends is refused with NOAUTH."""
    import urllib.parse

    from django.conf import settings

    url = urllib.parse.urlsplit(settings.REDIS_URL)
    if url.scheme != "redis" or not url.password:
        pytest.skip("needs a plain-TCP Redis with a password (the embedded one of a test run)")
    code = report(
        "import socket\n"
        f"conn = socket.create_connection(({url.hostname!r}, {url.port or 6379}), timeout=10)\n"
        "replies = []\n"
        "for command in (b'PING', b'KEYS *', b'LPUSH gpuplatform:forged x', b'AUTH default guess'):\n"
        "    conn.sendall(command + b'\\r\\n')\n"
        "    replies.append(conn.recv(200).decode(errors='replace').strip())\n"
        "result['replies'] = replies\n"
        f"result['given'] = [k for k, v in os.environ.items() if 'redis' in v.lower() or {url.password!r} in v]\n"
    )
    key = launch(runner, code)
    assert finish(runner, key)[1] == 0
    seen = result_of(runner, key)
    assert [reply.split()[0] for reply in seen["replies"][:3]] == ["-NOAUTH"] * 3, seen
    assert seen["replies"][3].startswith("-WRONGPASS"), seen
    assert seen["given"] == []  # no broker URL, no password in its environment
