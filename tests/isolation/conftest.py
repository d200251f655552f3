"""Attack tests: real jobs, run through the Runner as root, trying to reach what they must not.

Each skips with the reason where this machine cannot fence jobs (not root, no cgroups)."""

from __future__ import annotations

import json
import pathlib
import time
import uuid
from dataclasses import dataclass

import pytest

from tests.runners import stop_runner
from tests.unit.test_runner import Recorder, Work
from workers.isolation import PRIVATE_DIRS, detect, remove_node_groups
from workers.runner import Runner


@dataclass
class Job(Work):
    """An assignment with the resource fields the fence reads (0: the node's default)."""

    memory_mib: int = 0
    pids_max: int = 0
    cpu_weight: int = 0


class Keyed(Recorder):
    """The recorder, with the member each end belongs to (several jobs run at once here)."""

    def finished(self, run, exit_code, reason, checkpoint):
        self.events.append(("finished", exit_code, reason, run.key))


def outside_private_tmp() -> pathlib.Path:
    """Where a test puts host files a job must not reach: beside the code, as `make run` lays them
    out, unless the checkout sits under /tmp, which a fenced job sees as its own empty tmpfs (it
    would get ENOENT there, not the EACCES the fence gives); then /var/lib, which jobs see as is.
    """
    root = pathlib.Path(__file__).resolve().parents[2]
    if any(root.is_relative_to(private) for private in PRIVATE_DIRS):
        return pathlib.Path("/var/lib")
    return root


def fenced_runner(data_dir, *, node: str | None = None, fake_gpus: int = 0, **kwargs) -> Runner:
    node = node or f"iso-{uuid.uuid4().hex[:8]}"
    isolation = detect(node)
    if not isolation.jailed:
        pytest.skip(
            f"this machine cannot fence jobs ({isolation.reason}): the attack tests need root and cgroups"
        )
    runner = Runner(node=node, data_dir=data_dir, reporter=Keyed(), kill_grace=1.0, isolation=isolation,
                    fake_gpus=fake_gpus, **kwargs)  # fmt: skip
    _made.append(runner)
    return runner


_made: list[Runner] = []  # this test's runners: their nodes' cgroups go when it ends


@pytest.fixture(autouse=True)
def _no_node_cgroups_left():
    yield
    while _made:
        # The test nodes' own (empty) groups, as an agent's exit removes them: no clutter left.
        remove_node_groups(_made.pop().isolation.cgroups)


@pytest.fixture
def runner(tmp_path):
    runner = fenced_runner(tmp_path / "agent", fake_gpus=4)
    yield runner
    stop_runner(runner)
    # Its node's own groups go after this (_no_node_cgroups_left, torn down last).


def py(code: str) -> list[str]:
    return ["{python}", "-c", code]


def report(code: str) -> str:
    """A job body that prints `RESULT <json of the dict named result>` as its last line."""
    return f"import json, os, sys\nresult = {{}}\n{code}\nprint('RESULT', json.dumps(result), flush=True)\n"


def launch(runner: Runner, code: str, **fields) -> tuple[int, int]:
    attempt = fields.pop("attempt_id", None) or (max((k[0] for k in runner.runs), default=0) + 1)
    job = Job(argv=py(code), attempt_id=attempt, job_id=f"job-{attempt}", **fields)
    assert runner.launch(job)
    return (attempt, job.rank)


def finish(runner: Runner, key: tuple[int, int], timeout: float = 30) -> tuple:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        runner.tick()
        done = [e for e in runner.reporter.events if e[0] == "finished" and e[3] == key]
        if done:
            return done[0][:3]
        time.sleep(0.05)
    raise AssertionError(f"{key} did not finish within {timeout}s: {runner.reporter.events}")


def log_of(runner: Runner, key: tuple[int, int]) -> str:
    attempt, rank = key
    path = runner.data_dir / "logs" / f"job-{attempt}" / f"attempt-1-rank-{rank}.log"
    return path.read_text(errors="replace") if path.exists() else ""


def result_of(runner: Runner, key: tuple[int, int]) -> dict:
    lines = [line for line in log_of(runner, key).splitlines() if line.startswith("RESULT ")]
    assert lines, f"no RESULT line in the job's log:\n{log_of(runner, key)}"
    return json.loads(lines[-1][len("RESULT ") :])


def wait_for_line(runner: Runner, key: tuple[int, int], prefix: str, timeout: float = 20) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        runner.tick()
        for line in log_of(runner, key).split("\n")[
            :-1
        ]:  # whole lines only: print writes in pieces
            if line.startswith(prefix):
                return line[len(prefix) :].strip()
        time.sleep(0.05)
    raise AssertionError(f"no {prefix!r} line from {key}:\n{log_of(runner, key)}")
