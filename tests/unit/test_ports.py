"""MASTER_PORT leases (workers/ports.py) and their use by the runner: unique on the host while the
member runs (two gangs led from one node never share one, whatever their attempt ids), checked
free, given back at the end; a gang's other members start with the port rank 0's agent leased."""

import json
import os
import socket
import time

import pytest

from tests.unit.test_agent_api import cast  # noqa: F401 (the fixture)
from tests.unit.test_runner import Recorder, Work, run_until_finished, runner  # noqa: F401
from workers import ports

REPORT_PORT = (
    "import json, os, time; from gpuplatform_job import output_dir; "
    "(output_dir() / 'port.json').write_text(json.dumps(os.environ['MASTER_PORT'])); time.sleep({sleep})"
)


def _free_block(size: int = 4) -> int:
    """The first of `size` free ports in a row below the kernel's ephemeral range (from 32768 on
    Linux), where a busy host's outgoing connections would take ports at random, as in
    production's 29500-29999."""
    for first in range(23000, 32000, size):
        if all(ports._free(port) for port in range(first, first + size)):
            return first
    pytest.skip("no four free ports in a row below 32000 on this host")


@pytest.fixture
def leases(tmp_path):
    base = _free_block()
    return lambda first=base, last=base + 3: ports.PortLeases(tmp_path / "locks", (first, last))


def test_leases_are_unique_on_the_host_and_given_back(leases):
    one, other = leases(), leases()  # two agents of one host: one lock dir
    taken = [one.lease(), other.lease(), one.lease(), other.lease()]
    first = min(taken)
    assert sorted(taken) == [first, first + 1, first + 2, first + 3]
    with pytest.raises(ports.NoFreePort, match=f"{first}-{first + 3}"):
        one.lease()
    one.release(taken[0])
    assert other.lease() == taken[0]


def test_a_port_something_listens_on_is_not_leased(leases):
    busy = _free_block(2)
    with socket.socket() as server:
        server.bind(("127.0.0.1", busy))
        server.listen()
        assert leases(busy, busy + 1).lease() == busy + 1


def test_a_dead_agents_leases_are_free_again(leases, tmp_path):
    dead = leases()
    port = dead.lease()
    for fd in dead.held_fds():
        os.close(fd)  # as the kernel does when the agent dies
    assert leases(port, port).lease() == port


def test_two_gangs_led_from_one_node_get_different_ports(runner):  # noqa: F811
    """Attempts 7 and 1007: the same port under `29500 + attempt id % 1000`."""
    for attempt in (7, 1007):
        code = REPORT_PORT.format(sleep=1.5)
        runner.launch(Work(argv=["{python}", "-c", code], attempt_id=attempt, job_id=f"job-{attempt}",
                           world_size=2, master_port=29507))  # fmt: skip
    deadline = time.monotonic() + 30
    while len([e for e in runner.reporter.events if e[0] == "finished"]) < 2:
        assert time.monotonic() < deadline, runner.reporter.events
        runner.tick()
        time.sleep(0.05)
    seen = [int(json.loads(e[2])) for e in runner.reporter.events if e[0] == "artifact"]
    assert len(seen) == 2 and seen[0] != seen[1], seen
    assert all(29500 <= port <= 29999 for port in seen)
    assert runner.ports.held() == set()  # given back at the end


class Leader(Recorder):
    """Rank 0's port reaches the platform a moment after rank 1 is placed."""

    def __init__(self):
        super().__init__()
        self.asked = 0

    def started(self, run):
        self.events.append(("started", run.process.pid if run.process else 0))

    def leader_port(self, run):
        self.asked += 1
        return 29777 if self.asked >= 3 else 0


def test_another_member_starts_with_the_port_rank_0_leased(runner):  # noqa: F811
    runner.reporter = Leader()
    member = Work(
        argv=["{python}", "-c", REPORT_PORT.format(sleep=0)], rank=1, world_size=2, master_port=0
    )
    member.bundle, member.secrets, member.python_requirements = "", [], []  # type: ignore[attr-defined]
    runner.launch(member)
    assert run_until_finished(runner)[1:] == (0, "")
    assert runner.reporter.asked >= 3
    assert json.loads(next(e for e in runner.reporter.events if e[0] == "artifact")[2]) == "29777"


def test_rank_0s_start_report_gives_its_gang_the_port(cast, tmp_path):  # noqa: F811
    """Through the agent API as the agents call it: rank 0's start (the batch endpoint) carries
    the port it leased; rank 1's agent reads it from its member's assignment until it is there."""
    from apps.scheduling.dispatcher import dispatch_once
    from tests.factories import make_node
    from tests.unit.test_dispatcher import submit
    from tests.unit.test_rank_checkpoints import _members
    from workers.reporter import HttpReporter
    from workers.run import Run

    make_node("h1", gpus=1)
    make_node("h2", gpus=1)
    job = submit(cast, gpus=1, nodes=2)
    dispatch_once()
    attempt = job.attempts.get()
    (api0, a0), (api1, a1) = (_members(attempt)[rank] for rank in (0, 1))
    assert a0.master_port == a1.master_port == 0  # not leased yet: not the attempt id's
    waiting = Run(assignment=a1, workdir=tmp_path, log_path=tmp_path / "1.log")
    assert HttpReporter(api1).leader_port(waiting) == 0
    assert api1.report(a1, "started", pid=0, master_port=31000)  # rank 1's: not the rendezvous
    assert HttpReporter(api1).leader_port(waiting) == 0

    leader = Run(assignment=a0, workdir=tmp_path, log_path=tmp_path / "0.log", master_port=29777)
    assert HttpReporter(api0).started(leader)
    assert HttpReporter(api1).leader_port(waiting) == 29777
    assert api0.assignment(attempt.pk, 0, str(attempt.token)).master_port == 29777


def test_with_no_free_port_rank_0_never_starts_and_is_reported_lost(runner, leases):  # noqa: F811
    only = _free_block(1)
    runner.ports = leases(only, only)
    taken = leases(only, only)
    assert taken.lease() == only  # another agent of the host holds the only one
    failures = []
    runner.reporter.finished = lambda run, *_: (  # the HTTP reporter sends "lost" for these
        failures.append(run.failure),
        Recorder.finished(runner.reporter, run, *_),
    )
    runner.launch(Work(argv=["{python}", "-c", "print('ran')"], world_size=2))
    finish = run_until_finished(runner)
    assert failures == ["lost"]
    assert finish[1:] == (127, f"no free port for MASTER_PORT in {only}-{only}")
    assert not any(e[0] == "started" for e in runner.reporter.events)
    assert next(iter(runner.ended)) == (1, 0) and runner.runs == {}
