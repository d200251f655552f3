"""The runner on its own: real subprocesses, a recording reporter instead of the database."""

import signal
import sys
import time
from dataclasses import dataclass, field

import pytest

from tests.processes import alive
from workers.isolation import detect, unfenced
from workers.runner import Runner


@dataclass
class Work:
    argv: list
    job_id: str = "job-1"
    attempt_id: int = 1
    attempt_number: int = 1
    rank: int = 0
    token: str = "t"
    params: dict = field(default_factory=dict)
    gpu_indices: list = field(default_factory=lambda: [2, 5])
    world_size: int = 1
    master_addr: str = "127.0.0.1"
    master_port: int = 29501
    max_runtime_seconds: int = 60
    checkpoint: str = ""
    stop_requested: str = ""
    active: bool = True
    grace_seconds: int = 5
    checkpoint_signal: str = "SIGUSR1"


class Recorder:
    def __init__(self):
        self.events = []

    def started(self, run):
        self.events.append(("started", run.process.pid))

    def progress(self, run, progress, checkpoint):
        self.events.append(("progress", progress))

    def finished(self, run, exit_code, reason, checkpoint):
        self.events.append(("finished", exit_code, reason))

    def lost(self, run, reason):
        self.events.append(("lost", reason))

    def sync_log(self, run):
        pass

    def collect(self, run, name, source):
        self.events.append(("artifact", name, source.read().decode()))

    def finish(self):
        return next((e for e in self.events if e[0] == "finished"), None)


@pytest.fixture(params=["unfenced", "fenced"])
def runner(request, tmp_path):
    """Each runner test twice: jobs as the agent's own user, and fenced (own uid, cgroup and
    mount namespace) where this test runs as root with cgroups."""
    if request.param == "unfenced":
        return Runner(node="n1", data_dir=tmp_path, reporter=Recorder(), kill_grace=1.0,
                      isolation=unfenced("unit test of the unfenced path"))  # fmt: skip
    fenced = detect("n1")
    if not fenced.jailed:
        pytest.skip(f"cannot fence jobs here: {fenced.reason}")
    return Runner(
        node="n1", data_dir=tmp_path, reporter=Recorder(), kill_grace=1.0, isolation=fenced
    )


def run_until_finished(runner, timeout=20):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        runner.tick()
        if runner.reporter.finish():
            return runner.reporter.finish()
        time.sleep(0.05)
    raise AssertionError(f"no finish within {timeout}s: {runner.reporter.events}")


def py(code: str) -> list[str]:
    return ["{python}", "-c", code]


def test_a_job_sees_its_gpus_a_scrubbed_environment_and_its_own_workdir(runner, monkeypatch):
    monkeypatch.setenv("SECRET_KEY", "do-not-leak")
    code = (
        "import os, json, pathlib; from gpuplatform_job import output_dir; "
        "(output_dir() / 'env.json').write_text(json.dumps({'cvd': os.environ['CUDA_VISIBLE_DEVICES'], "
        "'secret': os.environ.get('SECRET_KEY'), 'cwd': os.getcwd(), 'sid': os.getsid(0) == os.getpid()}))"
    )
    runner.launch(Work(argv=py(code)))
    assert run_until_finished(runner) == ("finished", 0, "")
    artifact = next(e for e in runner.reporter.events if e[0] == "artifact")
    import json

    seen = json.loads(artifact[2])
    assert seen["cvd"] == "2,5"
    assert seen["secret"] is None
    assert seen["cwd"].endswith("attempt-1-rank-0")
    assert seen["sid"] is True  # its own session and process group


def test_a_task_of_an_array_sees_its_index_and_a_plain_job_none(runner):
    code = (
        "import os, json; from gpuplatform_job import output_dir; "
        "(output_dir() / 'env.json').write_text(json.dumps([os.environ.get(n) for n in "
        "('GPUPLATFORM_ARRAY_INDEX', 'SLURM_ARRAY_TASK_ID')]))"
    )
    task = Work(argv=py(code))
    task.array_index = 7  # type: ignore[attr-defined]
    runner.launch(task)
    assert run_until_finished(runner) == ("finished", 0, "")
    import json

    assert json.loads(next(e for e in runner.reporter.events if e[0] == "artifact")[2]) == [
        "7",
        "7",
    ]
    runner.reporter.events.clear()
    runner.launch(Work(argv=py(code), attempt_id=2))
    assert run_until_finished(runner) == ("finished", 0, "")
    assert json.loads(next(e for e in runner.reporter.events if e[0] == "artifact")[2]) == [
        None,
        None,
    ]


def test_a_failing_command_reports_its_exit_code(runner):
    runner.launch(Work(argv=py("import sys; sys.exit(7)")))
    assert run_until_finished(runner) == ("finished", 7, "exit code 7")


def test_a_job_that_exits_wakes_the_tick_whose_next_tick_reports_it(runner):
    """The agent's tick loop waits on runner.woken: a short job's end is seen without waiting
    out the loop's beat (the log pipe's close sets it)."""
    runner.launch(Work(argv=["sleep", "1"]))
    runner.tick()  # its start is reported (the Recorder answers at once)
    runner.woken.clear()  # well before it exits
    assert runner.woken.wait(30)  # set by the job's exit, not by a tick
    for _ in range(100):  # its exit status may lag its pipe's close by a moment
        runner.tick()
        if runner.reporter.finish():
            break
        time.sleep(0.01)
    assert runner.reporter.finish() == ("finished", 0, "")


def test_a_missing_program_fails_the_job_not_the_agent(runner):
    runner.launch(Work(argv=["definitely-not-a-program-xyz"]))
    finished = run_until_finished(runner)
    assert finished[1] == 127 and "could not start" in finished[2]


def test_a_job_past_its_max_runtime_is_killed_with_reason_timeout(runner):
    runner.launch(
        Work(
            argv=py(
                "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(60)"
            ),
            max_runtime_seconds=1,
        )
    )
    started = time.monotonic()
    finished = run_until_finished(runner)
    assert finished[2] == "timeout"
    assert (
        finished[1] == -signal.SIGKILL
    )  # it ignored SIGTERM, so the grace period ended in SIGKILL
    assert time.monotonic() - started < 10


def test_stopping_kills_the_whole_process_tree(runner):
    code = "import subprocess, time; c = subprocess.Popen(['sleep', '300']); print('child', c.pid, flush=True); time.sleep(300)"
    runner.launch(Work(argv=py(code)))
    log_path = runner.runs[(1, 0)].log_path
    deadline = time.monotonic() + 10
    while "child" not in log_path.read_text() and time.monotonic() < deadline:
        runner.tick()
        time.sleep(0.05)
    child = int(log_path.read_text().split()[1])
    runner.stop(1, 0, "cancel")
    assert run_until_finished(runner)[2] == "cancel"
    time.sleep(0.2)
    assert not alive(child)


def test_a_launch_delivered_twice_runs_once(runner):
    work = Work(argv=py("import time; time.sleep(0.5)"))
    assert runner.launch(work) is True
    assert runner.launch(work) is False
    run_until_finished(runner)
    assert [e for e in runner.reporter.events if e[0] == "started"].__len__() == 1


def test_a_restarted_agent_kills_the_orphans_of_the_previous_one(tmp_path):
    first = Runner(node="n1", data_dir=tmp_path, reporter=Recorder())
    first.launch(Work(argv=py("import time; time.sleep(300)")))
    pid = first.runs[(1, 0)].process.pid
    second = Runner(node="n1", data_dir=tmp_path, reporter=Recorder())
    assert second.kill_orphans() == 1
    first.runs[(1, 0)].process.wait(5)
    assert not alive(pid)


def test_progress_and_checkpoints_from_the_sdk_are_reported(runner):
    runner.launch(
        Work(
            argv=["{python}", "-m", "gpuplatform_job.demo_train"],
            params={"steps": 3, "step_seconds": 0.01},
        )
    )
    assert run_until_finished(runner)[1] == 0
    progress = [e[1] for e in runner.reporter.events if e[0] == "progress"]
    assert progress and progress[-1] == 1.0


def test_preemption_signals_the_job_which_checkpoints_and_exits(runner, tmp_path):
    work = Work(
        argv=["{python}", "-m", "gpuplatform_job.demo_train"],
        params={"steps": 1000, "step_seconds": 0.02},
    )
    runner.launch(work)
    deadline = time.monotonic() + 15
    while (
        not any(e[0] == "progress" for e in runner.reporter.events) and time.monotonic() < deadline
    ):
        runner.tick()
        time.sleep(0.05)
    runner.stop(1, 0, "preempt")
    started = time.monotonic()
    finished = run_until_finished(runner)
    assert finished == ("finished", 0, "preempt")  # it saved and exited within its grace period
    assert time.monotonic() - started < 5
    import json

    saved = json.loads((tmp_path / "checkpoints" / "job-1" / "checkpoint.json").read_text())
    assert 0 < saved["step"] < 1000


def test_a_job_that_ignores_the_checkpoint_signal_is_killed_after_the_grace(runner):
    code = "import signal, time; signal.signal(signal.SIGUSR1, signal.SIG_IGN); signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(60)"
    runner.launch(Work(argv=py(code), grace_seconds=1))
    time.sleep(0.5)
    runner.tick()
    started = time.monotonic()
    runner.stop(1, 0, "preempt")
    finished = run_until_finished(runner)
    assert finished[1] == -signal.SIGKILL
    assert 1.5 <= time.monotonic() - started < 8  # grace (1 s) + kill grace (1 s), then SIGKILL


if sys.platform != "linux":  # pragma: no cover
    pytest.skip("the runner relies on Linux process groups and /proc", allow_module_level=True)


def test_a_member_that_ended_here_never_runs_again(runner):
    """A start message redelivered, or a heartbeat answer read before the end was reported,
    may still list it: it ran once, it never runs twice."""
    work = Work(argv=py("print('ran', flush=True)"))
    assert runner.launch(work) is True
    log_path = runner.runs[(1, 0)].log_path
    assert run_until_finished(runner) == ("finished", 0, "")
    assert runner.launch(work) is False
    assert runner.runs == {}
    assert [e[0] for e in runner.reporter.events].count("started") == 1
    assert log_path.read_text().count("ran") == 1


def test_a_silent_job_has_its_log_synced_once_at_its_end(runner):
    """An empty log has nothing to send: the ticks while it runs do not open it."""
    syncs = []
    runner.reporter.sync_log = lambda run: syncs.append(run.log_path.stat().st_size)
    runner.launch(Work(argv=["sleep", "0.5"]))
    for _ in range(5):
        runner.tick()
        time.sleep(0.02)
    assert syncs == []
    assert run_until_finished(runner) == ("finished", 0, "")
    assert syncs == [0]


def test_the_checkpoint_marker_is_read_only_with_progress_to_report(runner, monkeypatch):
    from workers import joblog

    reads = []
    read = joblog.checkpoint_path
    monkeypatch.setattr(joblog, "checkpoint_path", lambda run: reads.append(1) or read(run))
    runner.launch(Work(argv=["sleep", "0.5"]))
    for _ in range(5):
        runner.tick()
        time.sleep(0.02)
    assert reads == []  # no progress.json: nothing to report, nothing read
    assert run_until_finished(runner) == ("finished", 0, "")
    assert reads == [1]  # the end's report names it
