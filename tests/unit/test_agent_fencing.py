"""An agent cut off from the platform kills its jobs before the platform declares the node lost
and runs them elsewhere: a job never runs in two places at once."""

import argparse
import pathlib
import time

import pytest

from apps.nodes.credentials import issue_credential
from tests.agent_http import agent_api
from tests.factories import make_cast, make_node
from tests.processes import alive
from tests.unit.test_dispatcher import placed_and_started
from tests.unit.test_runner import Recorder, Work, py, run_until_finished
from workers.agent import Agent, Config
from workers.reporter import HttpReporter
from workers.runner import FENCED, UNASSIGNED, Run


@pytest.fixture
def agent(tmp_path):
    config = Config(url="http://testserver", credential="gpn_unused.unused", data_dir=tmp_path, heartbeat_seconds=2,
                    lost_after_heartbeats=3)  # fmt: skip
    agent = Agent(argparse.Namespace(node="n1", sku="H100-80GB", gpus=1, fake=True, labels={}, concurrency=1),
                  config=config)  # fmt: skip
    agent.runner.reporter = Recorder()
    return agent


def reporter_for(node: str) -> HttpReporter:
    """The agent's reporter, through the agent API with the node's own credential."""
    return HttpReporter(agent_api(issue_credential(node_name=node)[1]))


def test_an_agent_that_misses_its_heartbeats_kills_its_jobs_before_the_node_is_declared_lost(agent):
    assert (
        agent.fence_after == 6
    )  # as long as the platform waits before it declares the node lost: 3 x 2 s
    agent.runner.launch(
        Work(
            argv=py(
                "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(60)"
            )
        )
    )
    pid = agent.runner.runs[(1, 0)].process.pid
    agent.fence()
    assert alive(pid)  # heartbeats are fine: nothing happens
    agent.last_heartbeat = time.monotonic() - 6.5
    agent.fence()
    assert run_until_finished(agent.runner, timeout=5)[1:] == (-9, FENCED)  # SIGKILL, no grace
    assert not alive(pid)


@pytest.fixture
def cast(db):
    return make_cast()


def test_a_job_killed_by_the_fence_is_retried_not_failed(cast, settings):
    make_node("h1", gpus=1)
    job, attempt = placed_and_started(cast)
    from apps.jobs.selectors import assignment

    run = Run(assignment=assignment(attempt.pk, 0, str(attempt.token)), workdir=pathlib.Path("."),
              log_path=pathlib.Path("."), stop_reason=FENCED)  # fmt: skip
    reporter_for("h1").finished(run, -9, FENCED, "")
    job.refresh_from_db()
    attempt.refresh_from_db()
    assert (attempt.state, job.state) == ("lost", "queued")
    assert job.reason.startswith(f"agent {FENCED}; retry 1 of")


def test_a_run_launched_while_the_agent_reads_the_database_is_not_taken_for_unassigned(
    agent, monkeypatch
):
    work = Work(argv=py("import time; time.sleep(60)"))

    def read_while_a_start_message_arrives():
        agent.runner.launch(work)  # placed after this read began: not in what it returns
        return {}

    monkeypatch.setattr(agent.api, "assignments", read_while_a_start_message_arrives)
    agent.sync()
    run = agent.runner.runs[(1, 0)]
    assert run.stop_reason == ""  # not killed as "not assigned here any more"
    agent.runner.kill_all("test over")
    run_until_finished(agent.runner)


def test_a_run_launched_during_the_heartbeat_request_is_not_taken_for_unassigned(
    agent, monkeypatch
):
    """The heartbeat's answer carries what runs here, read while the request was on its way."""
    work = Work(argv=py("import time; time.sleep(60)"))

    def heartbeat_while_a_start_message_arrives(**kwargs):
        agent.runner.launch(work)
        return {}

    monkeypatch.setattr(agent.api, "heartbeat", heartbeat_while_a_start_message_arrives)
    agent.sync(*agent.heartbeat_once())
    run = agent.runner.runs[(1, 0)]
    assert run.stop_reason == ""
    agent.runner.kill_all("test over")
    run_until_finished(agent.runner)


def test_a_job_the_agent_stopped_as_unassigned_while_still_assigned_is_retried_not_failed(cast):
    make_node("h1", gpus=1)
    job, attempt = placed_and_started(cast)
    from apps.jobs.selectors import assignment

    run = Run(assignment=assignment(attempt.pk, 0, str(attempt.token)), workdir=pathlib.Path("."),
              log_path=pathlib.Path("."), stop_reason=UNASSIGNED)  # fmt: skip
    reporter_for("h1").finished(run, -15, UNASSIGNED, "")
    job.refresh_from_db()
    assert job.state == "queued" and job.attempts.get().state == "lost"


class Unreachable:
    """The agent API as seen from a node cut off from the web (or with a revoked credential)."""

    timeout = 5.0

    def heartbeat(self, **kwargs):
        from workers.agent_client import ApiError

        raise ApiError("connection refused")

    def assignments(self):
        raise AssertionError("not reached: the heartbeat failed first")


def test_heartbeats_failing_over_http_fence_the_jobs(agent):
    agent.api = Unreachable()
    agent.heartbeat_seconds, agent.fence_after = 0.1, 0.5
    agent.runner.launch(Work(argv=py("import time; time.sleep(60)")))
    pid = agent.runner.runs[(1, 0)].process.pid
    agent.start_threads()
    try:
        deadline = time.monotonic() + 20
        while agent.runner.reporter.finish() is None and time.monotonic() < deadline:
            time.sleep(0.1)
        assert agent.runner.reporter.finish()[1:] == (-9, FENCED)
        assert not alive(pid)
    finally:
        agent.stopping.set()


def test_an_agent_replaced_by_another_kills_every_job_before_it_exits(agent, monkeypatch):
    """It leaves with os._exit (no atexit hook runs): a job that ignores SIGTERM is SIGKILLed first."""
    import workers.agent

    agent.runner.launch(
        Work(
            argv=py(
                "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(60)"
            )
        )
    )
    pid = agent.runner.runs[(1, 0)].process.pid

    def exit_now(code):
        raise SystemExit(code)

    monkeypatch.setattr(agent.api, "heartbeat", lambda **kwargs: None)  # another agent took over
    monkeypatch.setattr(workers.agent.os, "_exit", exit_now)
    with pytest.raises(SystemExit):
        agent.heartbeat_once()
    run = agent.runner.runs[(1, 0)]
    assert run.stop_reason == "agent replaced"
    # No tick escalates a SIGTERM here: only the SIGKILL before the exit ends it.
    assert run.process.wait(timeout=30) == -9
    assert not alive(pid)
