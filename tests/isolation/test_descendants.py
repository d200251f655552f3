"""No descendant outlives its job: a job that double-forks a setsid'd daemon leaves nothing
when it is cancelled, times out, is preempted, is fenced, exits, or its agent is killed."""

import json
import os
import pathlib
import signal
import subprocess
import sys
import time
import uuid

import pytest

from tests.isolation.conftest import fenced_runner, finish, launch, wait_for_line
from tests.processes import alive
from workers.runner import FENCED

ROOT = pathlib.Path(__file__).resolve().parents[2]

# The job's main process forks a child that setsids and forks the daemon, then exits: the
# daemon is in no process group of the job's and its parent is gone.
DAEMONIZE = """
import os, signal, sys, time
signal.signal(signal.SIGUSR2, lambda *_: sys.exit(0))  # the test's cue to end cleanly
child = os.fork()
if child == 0:
    os.setsid()
    daemon = os.fork()
    if daemon == 0:
        os.execvp('sleep', ['sleep', '300'])
    print('DAEMON', daemon, flush=True)
    os._exit(0)
os.waitpid(child, 0)
print('MAIN', os.getpid(), flush=True)
"""


def gone(pid: int, timeout: float = 10) -> bool:
    deadline = time.monotonic() + timeout
    while alive(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    return not alive(pid)


def start_daemonizing_job(runner, tail: str, **fields):
    key = launch(runner, DAEMONIZE + tail, **fields)
    daemon = int(wait_for_line(runner, key, "DAEMON"))
    main = int(wait_for_line(runner, key, "MAIN"))
    assert alive(daemon) and os.getsid(daemon) != os.getsid(main)
    return key, main, daemon


@pytest.mark.parametrize("why", ["cancel", "preempt", "agent stopping"])
def test_a_stopped_job_leaves_no_descendant(runner, why):
    key, main, daemon = start_daemonizing_job(runner, "time.sleep(300)", grace_seconds=1)
    runner.stop(*key, why)
    assert finish(runner, key)[2] == why
    assert gone(main) and gone(daemon)


def test_a_job_past_its_max_runtime_leaves_no_descendant(runner):
    key, main, daemon = start_daemonizing_job(runner, "time.sleep(300)", max_runtime_seconds=1)
    assert finish(runner, key)[2] == "timeout"
    assert gone(daemon)


def test_a_fenced_off_agent_kills_every_descendant(runner):
    key, main, daemon = start_daemonizing_job(runner, "time.sleep(300)")
    runner.kill_all()
    assert finish(runner, key)[1:] == (-signal.SIGKILL, FENCED)
    assert gone(daemon)


def test_a_job_whose_main_process_exits_leaves_no_descendant(runner):
    key, main, daemon = start_daemonizing_job(runner, "time.sleep(300)")
    os.kill(main, signal.SIGUSR2)  # the main process ends on its own, cleanly, its daemon still up
    assert finish(runner, key)[1:] == (0, "")
    assert gone(daemon)


AGENT = """
import json, pathlib, sys, time
from tests.isolation.conftest import Job, Keyed, py
from tests.isolation.test_descendants import DAEMONIZE
from workers.isolation import detect
from workers.runner import Runner

node, data_dir = sys.argv[1], pathlib.Path(sys.argv[2])
runner = Runner(node=node, data_dir=data_dir, reporter=Keyed(), isolation=detect(node))
reaper = runner.start_reaper() if sys.argv[3] != "sleep-no-reaper" else None
runner.launch(Job(argv=py(DAEMONIZE + "time.sleep(300)")))
log = data_dir / "logs" / "job-1" / "attempt-1-rank-0.log"
while "MAIN" not in (log.read_text() if log.exists() else ""):
    runner.tick()
    time.sleep(0.05)
pids = {line.split()[0]: int(line.split()[1]) for line in log.read_text().splitlines()}
pids["REAPER"] = reaper.pid if reaper else None
print(json.dumps(pids), flush=True)
if sys.argv[3] == "exit":
    sys.stdin.readline()  # until the test has looked
    sys.exit(0)
time.sleep(300)
"""


def start_agent(node: str, data_dir: pathlib.Path, end: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", AGENT, node, str(data_dir), end], cwd=ROOT, text=True,
                            env=dict(os.environ, PYTHONPATH=str(ROOT)), stdin=subprocess.PIPE, stdout=subprocess.PIPE)  # fmt: skip


def test_an_agent_that_exits_takes_every_descendant_of_its_jobs_with_it(tmp_path):
    fenced_runner(tmp_path / "probe")  # skips here where jobs cannot be fenced
    agent = start_agent(f"iso-{uuid.uuid4().hex[:8]}", tmp_path / "agent", "exit")
    pids = json.loads(agent.stdout.readline())
    assert alive(pids["DAEMON"])
    agent.stdin.write("\n")
    agent.stdin.flush()
    assert agent.wait(30) == 0  # a plain exit: its atexit hook kills every job cgroup
    assert gone(pids["MAIN"]) and gone(pids["DAEMON"])


def test_a_killed_agents_jobs_die_with_it_every_descendant(tmp_path):
    node = f"iso-{uuid.uuid4().hex[:8]}"
    probe = fenced_runner(tmp_path / "probe")  # skips here where jobs cannot be fenced
    assert probe.isolation.cgroups is not None and probe.isolation.cgroups.v2_base is not None
    node_group = probe.isolation.cgroups.v2_base.parent / node
    agent = start_agent(node, tmp_path / "agent", "sleep")
    try:
        pids = json.loads(agent.stdout.readline())
        assert alive(pids["DAEMON"]) and alive(pids["REAPER"])
    finally:
        agent.kill()  # SIGKILL: no atexit, no shutdown
        agent.wait(10)
    # PR_SET_PDEATHSIG kills the main process at once; the setsid'd daemon is beyond it, in the
    # member's cgroup, which the agent's reaper kills once the agent's pipe closes.
    assert gone(pids["MAIN"])
    assert gone(pids["DAEMON"])
    assert gone(pids["REAPER"])  # its work done
    assert not node_group.exists()  # and the node's own group gone with its jobs' groups
    successor = fenced_runner(tmp_path / "agent", node=node)
    assert successor.isolation.cgroups.leftovers(set()) == []
    assert successor.kill_orphans() == 0


def test_a_killed_agent_whose_reaper_died_too_leaves_the_rest_to_its_successor(tmp_path):
    node = f"iso-{uuid.uuid4().hex[:8]}"
    fenced_runner(tmp_path / "probe")  # skips here where jobs cannot be fenced
    agent = start_agent(node, tmp_path / "agent", "sleep-no-reaper")
    try:
        pids = json.loads(agent.stdout.readline())
    finally:
        agent.kill()  # SIGKILL, and no reaper (as if the reaper was killed first)
        agent.wait(10)
    assert gone(pids["MAIN"])
    assert alive(pids["DAEMON"])  # in the member's cgroup, which outlives the agent...
    # ...until the node's next agent starts: it kills the cgroups its predecessor left.
    successor = fenced_runner(tmp_path / "agent", node=node)
    assert successor.kill_orphans() == 1
    assert gone(pids["DAEMON"])
    assert successor.isolation.cgroups.leftovers(set()) == []


def test_an_agent_never_takes_another_agents_jobs_for_orphans(tmp_path):
    """Two agents with one node name on one host (two test runs, an operator's slip): each
    kills only what an agent of its own data dir left."""
    node = f"iso-{uuid.uuid4().hex[:8]}"
    first = fenced_runner(tmp_path / "one", node=node)
    key = launch(first, "import os, time; print('PID', os.getpid(), flush=True); time.sleep(60)")
    pid = int(wait_for_line(first, key, "PID"))
    other = fenced_runner(tmp_path / "two", node=node)
    assert other.kill_orphans() == 0
    assert alive(pid)
    first.kill_all("test over")
    finish(first, key)
