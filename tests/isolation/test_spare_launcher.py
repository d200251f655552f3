"""The fork server's spare (workers/forkserver.py, runner.py `_spare_when_idle`): on an idle
node, a process already forked and moved into fresh cgroups waits for the next member, whose
start then skips the fork and the cgroup move; while members run, none waits. The member gets its own limits on those groups
before its exec; a spare that is gone is never needed; a re-register's sweep for leftovers spares
the members that run in a spare's groups; an exiting agent leaves no spare behind."""

import time

import pytest

from tests.isolation.conftest import finish, launch, report, result_of
from tests.isolation.test_limits import cgroup_limits
from tests.processes import alive


@pytest.fixture(autouse=True)
def _spare_on(monkeypatch):
    """On by default (docs/operations.md); these tests say so whatever the run's environment
    sets, before `runner` is made."""
    monkeypatch.setenv("GPUPLATFORM_SPARE_LAUNCHER", "1")


def spare_of(runner):
    """The waiting spare's cgroups and the pids in them (once its move is done)."""
    deadline = time.monotonic() + 10
    while runner._spare is None and time.monotonic() < deadline:
        runner.tick()  # as the agent's tick loop does
        time.sleep(0.01)
    assert runner._spare is not None, "no spare readied on an idle node"
    group = runner._spare[1]
    while not group.pids() and time.monotonic() < deadline:
        time.sleep(0.01)
    return group, group.pids()


def test_no_spare_waits_while_a_member_runs(runner):
    key = launch(runner, "import time; time.sleep(300)")
    for _ in range(10):
        runner.tick()
        time.sleep(0.01)
    assert runner._spare is None
    runner.stop(*key, why="test over")
    finish(runner, key)
    spare_of(runner)  # idle again: one waits


def test_the_next_member_starts_in_the_process_already_waiting_in_its_cgroups(runner):
    assert finish(runner, launch(runner, "pass"))[1] == 0
    group, waiting = spare_of(runner)
    assert len(waiting) == 1
    key = launch(
        runner, report("result['pid'] = os.getpid()"), attempt_id=2, memory_mib=96, pids_max=33
    )
    run = runner.runs[key]
    assert run.cgroup is group
    assert {run.process.pid} == waiting
    limits = cgroup_limits(run)
    assert limits["memory"] == 96 * 2**20 and limits["pids"] == 33
    assert finish(runner, key)[1] == 0
    assert result_of(runner, key)["pid"] in waiting  # the job itself, exec'd in that process


def test_a_member_starts_without_the_spare_when_it_is_gone(runner):
    assert finish(runner, launch(runner, "pass"))[1] == 0
    group, waiting = spare_of(runner)
    group.kill()  # as a sweep would
    deadline = time.monotonic() + 10
    while any(alive(pid) for pid in waiting) and time.monotonic() < deadline:
        time.sleep(0.01)
    key = launch(runner, report("result['pid'] = os.getpid()"), attempt_id=2)
    assert finish(runner, key)[1] == 0
    assert result_of(runner, key)["pid"] not in waiting


def test_a_sweep_for_leftovers_keeps_a_member_running_in_a_spares_cgroups(runner):
    assert finish(runner, launch(runner, "pass"))[1] == 0
    spare_of(runner)
    key = launch(runner, "import time; time.sleep(300)", attempt_id=2)
    run = runner.runs[key]
    assert ".spare-" in run.cgroup.paths[0].name
    assert runner.kill_orphans() == 0  # what a register after a platform restart does
    assert alive(run.process.pid)


def test_an_exiting_agent_leaves_no_spare_behind(runner):
    assert finish(runner, launch(runner, "pass"))[1] == 0
    group, waiting = spare_of(runner)
    runner.kill_everything("agent exiting")
    assert not any(path.exists() for path in group.paths)
    assert not any(alive(pid) for pid in waiting)
