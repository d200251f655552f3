"""The fence's steps run in the child the fork server forks (workers/forkserver.py, then
workers/jail.py `enter`), with no launcher process per job: a step that fails there stops the
member before any of the job runs and says why; the job's exit status comes back from the fork
server; if the fork server dies, its jobs die with it and are seen as killed; and a fenced
member's start and end write no state file."""

import os
import signal
import time

import pytest

from tests.isolation.conftest import finish, launch
from tests.processes import alive
from workers.forkserver import IGNORED, ForkServer, LaunchFailed


def test_a_failed_fence_step_runs_nothing_of_the_job_and_says_why(runner, monkeypatch, tmp_path):
    marker = tmp_path / "ran"
    launch_for_real = ForkServer.launch

    def into_a_missing_dir(self, argv, env, spec, output_fd):
        return launch_for_real(self, argv, env, {**spec, "cwd": str(tmp_path / "gone")}, output_fd)

    monkeypatch.setattr(ForkServer, "launch", into_a_missing_dir)  # the fence's last step fails
    key = launch(runner, f"open({str(marker)!r}, 'w').write('ran')")
    exit_code, reason = finish(runner, key)[1:3]
    assert exit_code == 127
    assert reason.startswith("could not start: ") and "gone" in reason
    assert not marker.exists()
    assert not runner.runs  # ended and settled; its cgroup and uid go back as usual


def test_the_job_is_the_fork_servers_child_and_its_exit_status_comes_back(runner):
    key = launch(runner, "import sys; sys.exit(3)")
    assert finish(runner, key)[1] == 3
    key = launch(runner, "import os; os.kill(os.getpid(), 9)", attempt_id=2)
    assert finish(runner, key)[1] == -9
    assert runner._forks is not None
    server = runner._forks.pid
    assert server != os.getpid() and alive(server)


def test_the_jobs_die_with_the_fork_server_and_the_next_start_gets_a_new_one(runner):
    key = launch(runner, "import time; time.sleep(300)")
    run = runner.runs[key]
    server = runner._forks
    assert server is not None
    os.kill(server.pid, signal.SIGKILL)
    assert run.process is not None and run.process.wait(10) == -9
    deadline = time.monotonic() + 10
    while alive(run.process.pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not alive(run.process.pid)  # its parent-death signal
    finish(runner, key)
    second = launch(runner, "pass", attempt_id=2)
    assert finish(runner, second)[1] == 0
    assert runner._forks is not server


def test_a_fenced_member_writes_no_state_file_as_it_starts_and_ends(runner):
    # runs.json lists unfenced process groups only: for fenced members it stays as it was.
    first = launch(runner, "pass")
    finish(runner, first)
    before = os.stat(runner.state_file)
    second = launch(runner, "pass", attempt_id=2)
    assert finish(runner, second)[1] == 0
    after = os.stat(runner.state_file)
    assert (after.st_ino, after.st_mtime_ns) == (before.st_ino, before.st_mtime_ns)


def test_the_fork_server_outlives_a_sigterm_and_its_jobs_ignore_no_signal(runner):
    """A SIGTERM to the agent's process group (or its service) reaches the fork server too: the
    jobs must still end through the agent's graceful stop, not with the server. And nothing the
    server (a Python process: SIGPIPE, SIGXFSZ) ignores stays ignored in the job."""
    key = launch(runner, "import time; time.sleep(300)")
    assert runner._forks is not None
    os.kill(runner._forks.pid, signal.SIGTERM)
    time.sleep(0.3)
    assert alive(runner._forks.pid) and runner.runs[key].process.poll() is None
    runner.stop(*key, why="test over")
    finish(runner, key)
    ignored = _ignored_signals(runner, attempt_id=2)
    # Measured against the agent's own process (here pytest's): what it was handed ignored, a
    # job inherits as from any launcher (a full suite's process once ignored signal 32, left by
    # something that ran before this test); what the server ignores of its own must not pass on.
    inherited = _own_ignored_signals()
    server_ignored = sum(1 << (signum - 1) for signum in IGNORED)
    added = ignored & ~(inherited & ~server_ignored)
    assert added == 0, f"the job starts with signals ignored: {added:#x}"


def _own_ignored_signals() -> int:
    with open("/proc/self/status") as status:
        line = next(line for line in status if line.startswith("SigIgn:"))
    return int(line.split()[1], 16)


def _ignored_signals(runner, *, attempt_id: int) -> int:
    from tests.isolation.conftest import Job, log_of

    work = Job(argv=["sh", "-c", "grep SigIgn /proc/self/status"], attempt_id=attempt_id,
               job_id=f"job-{attempt_id}")  # fmt: skip
    assert runner.launch(work)
    finish(runner, (attempt_id, 0))
    line = log_of(runner, (attempt_id, 0)).split()
    return int(line[line.index("SigIgn:") + 1], 16)


def test_a_request_larger_than_the_socket_takes_is_refused_before_it_is_sent():
    server = ForkServer()
    try:
        with pytest.raises(LaunchFailed, match="too large"):
            server.launch(["true"], {"BIG": "x" * 300_000}, {}, 1)
        assert server.alive()
    finally:
        server.close()
