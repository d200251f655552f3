"""The fence's steps run in the child the runner forks (workers/jail.py `enter`, subprocess's
preexec_fn), with no launcher process per job: a step that fails there stops the member before
any of the job runs and says why; and a fenced member's start and end write no state file."""

import os

from tests.isolation.conftest import finish, launch
from workers import jail


def test_a_failed_fence_step_runs_nothing_of_the_job_and_says_why(runner, monkeypatch, tmp_path):
    marker = tmp_path / "ran"

    def refuse(uid: int, gid: int) -> None:
        raise OSError(f"no uid {uid} for this test")

    monkeypatch.setattr(jail, "become", refuse)  # the forked child calls the patched one
    key = launch(runner, f"open({str(marker)!r}, 'w').write('ran')")
    exit_code, reason = finish(runner, key)[1:3]
    assert exit_code == 127
    assert reason.startswith("could not start: no uid ") and "for this test" in reason
    assert not marker.exists()
    assert not runner.runs  # ended and settled; its cgroup and uid go back as usual


def test_a_fenced_member_writes_no_state_file_as_it_starts_and_ends(runner):
    # runs.json lists unfenced process groups only: for fenced members it stays as it was.
    first = launch(runner, "pass")
    finish(runner, first)
    before = os.stat(runner.state_file)
    second = launch(runner, "pass", attempt_id=2)
    assert finish(runner, second)[1] == 0
    after = os.stat(runner.state_file)
    assert (after.st_ino, after.st_mtime_ns) == (before.st_ino, before.st_mtime_ns)
