"""The node's side of sessions (workers/sessions.py) without the platform: the holder's exit file
written without trusting the job's dir, the listening-socket check of port-forwarding, the idle
timeout of interactive jobs."""

from __future__ import annotations

import os
import pathlib
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass

from tests.unit.test_runner import Work
from workers import sessions
from workers.runner import Run


@dataclass
class Interactive(Work):
    interactive: bool = True
    idle_timeout_seconds: float = 60


def run_in(workdir: pathlib.Path, **fields) -> Run:
    (workdir / ".gpuplatform").mkdir(parents=True, exist_ok=True)
    return Run(
        assignment=Interactive(argv=["hold"], **fields), workdir=workdir, log_path=workdir / "log"
    )


def test_the_holder_is_told_its_exit_status_in_its_own_control_dir(tmp_path):
    run = run_in(tmp_path / "w")
    assert sessions.end_hold(run, 7)
    assert (tmp_path / "w" / ".gpuplatform" / sessions.EXIT_FILE).read_text() == "7"


def test_a_link_the_job_planted_is_never_written_through(tmp_path):
    victim = tmp_path / "victim"
    victim.write_text("precious")
    run = run_in(tmp_path / "w")
    exit_file = tmp_path / "w" / ".gpuplatform" / sessions.EXIT_FILE
    exit_file.symlink_to(victim)
    assert not sessions.end_hold(run, 0)
    exit_file.unlink()
    os.link(victim, exit_file)  # a second name for the victim: two links
    assert not sessions.end_hold(run, 0)
    assert victim.read_text() == "precious"
    other = tmp_path / "other"
    other.mkdir()
    linked = run_in(tmp_path / "w2")
    (tmp_path / "w2" / ".gpuplatform").rmdir()
    (tmp_path / "w2" / ".gpuplatform").symlink_to(other)  # the control dir itself a link
    assert not sessions.end_hold(linked, 0)
    assert not list(other.iterdir())


def test_addresses_a_listener_is_reached_at():
    assert sessions.connect_address("0100007F", 4) == "127.0.0.1"
    assert sessions.connect_address("00000000", 4) == "127.0.0.1"  # any address: loopback
    assert sessions.connect_address("0" * 32, 6) == "::1"


def listener_job(port: int) -> subprocess.Popen:
    code = (f"import socket, time; s = socket.create_server(('127.0.0.1', {port})); print('up', flush=True); "
            "time.sleep(60)")  # fmt: skip
    process = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True,
                               start_new_session=True)  # fmt: skip
    assert process.stdout is not None and process.stdout.readline().strip() == "up"
    return process


def test_a_port_is_forwarded_only_when_a_process_of_the_job_listens_on_it(tmp_path):
    with socket.socket() as free:
        free.bind(("127.0.0.1", 0))
        port = free.getsockname()[1]
    process = listener_job(port)
    try:
        run = run_in(tmp_path / "w")
        run.process = process  # unfenced: the job is its session's processes
        assert sessions.job_listens(run, port) == "127.0.0.1"
        with socket.create_server(("127.0.0.1", 0)) as others:  # another process's port
            assert sessions.job_listens(run, others.getsockname()[1]) is None
        assert sessions.job_listens(run, 1) is None  # nobody listens
    finally:
        process.kill()
        process.wait()


class FakeRunner:
    def __init__(self):
        self.stopped = []

    def stop(self, attempt_id, rank, why):
        self.stopped.append((attempt_id, rank, why))


class FakeAgent:
    def __init__(self, runs):
        self.runs, self.runner, self.stopping = runs, FakeRunner(), threading.Event()

    def local_runs(self):
        return dict(self.runs)


def test_an_interactive_job_idle_past_its_timeout_is_stopped_on_rank_0_only(tmp_path):
    idle = run_in(tmp_path / "a", attempt_id=1)
    busy = run_in(tmp_path / "b", attempt_id=2)
    other_rank = run_in(tmp_path / "c", attempt_id=3, rank=1)
    for run in (idle, busy, other_rank):
        run.started = time.monotonic() - 120
    agent = FakeAgent({run.key: run for run in (idle, busy, other_rank)})
    tracker = sessions.Sessions(agent)  # type: ignore[arg-type]
    tracker.touch(busy.key)
    tracker.check_idle()
    assert agent.runner.stopped == [(1, 0, "idle timeout: nothing typed or printed for 1 min")]


def gang_rank_0(tmp_path, attempt_id: int) -> Run:
    run = run_in(tmp_path / f"g{attempt_id}", attempt_id=attempt_id, world_size=2)
    run.started = time.monotonic() - 120
    return run


def test_a_gangs_rank_0_asks_how_long_every_ranks_sessions_were_quiet_before_it_ends_the_job(
    tmp_path,
):
    typed_on_rank_1 = gang_rank_0(tmp_path, 1)  # a user at rank 1's node, 5 s ago
    quiet_everywhere = gang_rank_0(tmp_path, 2)
    never_used = gang_rank_0(tmp_path, 3)
    agent = FakeAgent({run.key: run for run in (typed_on_rank_1, quiet_everywhere, never_used)})
    tracker = sessions.Sessions(agent)  # type: ignore[arg-type]
    quiet = {1: 5.0, 2: 90.0, 3: None}
    tracker.platform_quiet_for = lambda run: quiet[run.assignment.attempt_id]  # type: ignore[method-assign]
    tracker.check_idle()
    assert [stop[0] for stop in agent.runner.stopped] == [2, 3]
    # Rank 1's activity counts as this job's: it is idle again only a timeout after it.
    agent.runner.stopped.clear()
    agent.runs = {typed_on_rank_1.key: typed_on_rank_1}
    quiet[1] = None  # were it asked again, it would end the job
    tracker.check_idle(now=time.monotonic() + 50)
    assert agent.runner.stopped == []
    tracker.check_idle(now=time.monotonic() + 60)
    assert [stop[0] for stop in agent.runner.stopped] == [1]


def test_a_gang_whose_rank_0_cannot_ask_the_platform_is_not_ended_and_asks_again_later(tmp_path):
    run = gang_rank_0(tmp_path, 1)
    agent = FakeAgent({run.key: run})
    tracker = sessions.Sessions(agent)  # type: ignore[arg-type]
    asked = []

    def unreachable(run):
        asked.append(run.key)
        raise OSError("connection refused")

    tracker.platform_quiet_for = unreachable  # type: ignore[method-assign]
    now = time.monotonic()
    tracker.check_idle(now=now)
    tracker.check_idle(now=now + 1)
    assert agent.runner.stopped == [] and len(asked) == 1
    tracker.platform_quiet_for = lambda run: 200.0  # type: ignore[method-assign]
    tracker.check_idle(now=now + sessions.RECHECK_SECONDS + 1)
    assert [stop[0] for stop in agent.runner.stopped] == [1]
