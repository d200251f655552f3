"""Broker messages are hints anyone with broker access could forge: the agent acts on a start or
a stop only when the agent API confirms the (attempt, rank, token) is placed on its node (and, for
a stop, that the platform asked it to stop). A forged one changes nothing."""

import argparse
import dataclasses
import pathlib

import pytest

from apps.jobs import services
from apps.nodes.credentials import issue_credential
from tests.agent_http import agent_api
from tests.factories import make_cast, make_node
from tests.unit.test_dispatcher import placed_and_started
from tests.unit.test_runner import Recorder, Work, py, run_until_finished
from workers import current, tasks
from workers.agent import Agent, Config

FORGED = "00000000-0000-0000-0000-000000000000"


@pytest.fixture
def cast(db):
    return make_cast()


@pytest.fixture
def agent(cast, tmp_path):
    make_node("h1", gpus=1)
    make_node("h2", gpus=1)
    config = Config(url="http://testserver", credential="unused", data_dir=tmp_path)
    agent = Agent(argparse.Namespace(node="h1", sku="H100-80GB", gpus=1, fake=True, labels={}, concurrency=1),
                  config=config, api=agent_api(issue_credential(node_name="h1")[1]))  # fmt: skip
    agent.runner.reporter = Recorder()
    launched = []
    agent.launched = launched
    real_launch = agent.runner.launch

    def launch(work):
        launched.append((work.attempt_id, work.rank))
        return real_launch(work)

    agent.runner.launch = launch
    current.AGENT = agent
    yield agent
    current.AGENT = None
    agent.runner.kill_all("test over")


def run_here(agent, attempt):
    """A stand-in process for the member, as if it had been started here."""
    work = Work(
        argv=py("import time; time.sleep(60)"), attempt_id=attempt.pk, token=str(attempt.token)
    )
    agent.runner.launch(work)
    agent.launched.clear()
    return agent.runner.runs[(attempt.pk, 0)]


def test_a_start_with_a_wrong_token_starts_nothing(agent, cast):
    _, attempt = placed_and_started(cast)
    assert attempt.members.get().node.name == "h1"
    tasks.start_attempt(attempt.pk, 0, FORGED)
    tasks.start_attempt(attempt.pk, 0, "not-even-a-uuid")
    assert agent.launched == [] and agent.runner.runs == {}


def test_a_start_for_another_nodes_member_starts_nothing(agent, cast):
    from apps.nodes.models import Node

    Node.objects.filter(name="h1").update(state="cordoned")  # so the job goes to h2
    _, attempt = placed_and_started(cast)
    assert attempt.members.get().node.name == "h2"
    tasks.start_attempt(attempt.pk, 0, str(attempt.token))  # the right token, the wrong node
    assert agent.launched == [] and agent.runner.runs == {}


def test_a_genuine_start_starts_the_member(agent, cast):
    job = placed_and_started(cast)[0]
    attempt = job.attempts.get()
    api_launch = []
    agent.runner.launch = lambda work: api_launch.append(dataclasses.asdict(work))
    tasks.start_attempt(attempt.pk, 0, str(attempt.token))
    assert [(w["attempt_id"], w["token"]) for w in api_launch] == [(attempt.pk, str(attempt.token))]


def test_a_forged_stop_stops_nothing_and_a_real_one_does(agent, cast):
    job, attempt = placed_and_started(cast)
    run = run_here(agent, attempt)
    tasks.stop_attempt(attempt.pk, 0, FORGED, why="cancel")  # wrong token
    assert run.stop_reason == ""
    tasks.stop_attempt(
        attempt.pk, 0, str(attempt.token), why="cancel"
    )  # right token, no stop asked
    assert run.stop_reason == ""
    assert run.process.poll() is None  # still running

    services.job_cancel(job=job, actor="test")
    tasks.stop_attempt(attempt.pk, 0, str(attempt.token), why="made-up reason")
    assert run.stop_reason == "cancel"  # the platform's reason, not the message's
    assert run_until_finished(agent.runner, timeout=10)[2] == "cancel"


def test_a_stop_for_a_member_of_another_node_is_ignored(agent, cast):
    """Even one this agent happens to run under that key: the platform has it elsewhere."""
    from apps.nodes.models import Node

    Node.objects.filter(name="h1").update(state="cordoned")
    job, attempt = placed_and_started(cast)  # on h2
    run = run_here(agent, attempt)
    services.job_cancel(job=job, actor="test")
    tasks.stop_attempt(attempt.pk, 0, str(attempt.token), why="cancel")
    assert run.stop_reason == ""


def test_config_comes_from_the_environment_only(tmp_path):
    args = argparse.Namespace(node="n1", credential_file=None)
    with pytest.raises(SystemExit, match="GPUPLATFORM_URL"):
        Config.from_env(args, environ={})
    with pytest.raises(SystemExit, match="credential"):
        Config.from_env(args, environ={"GPUPLATFORM_URL": "http://127.0.0.1:8000"})
    (tmp_path / "cred").write_text("gpn_a.b\n")
    config = Config.from_env(argparse.Namespace(node="n1", credential_file=tmp_path / "cred"),
                             environ={"GPUPLATFORM_URL": "http://127.0.0.1:8000", "GPUPLATFORM_DATA_DIR": str(tmp_path)})  # fmt: skip
    assert (config.credential, config.data_dir) == ("gpn_a.b", pathlib.Path(tmp_path).resolve())


def test_a_start_redelivered_after_the_member_ended_here_starts_nothing(agent, cast):
    """A gang's attempt runs on while its other member does: the start message of the member
    that already ended here (restored by the broker after a restart) must not run it again."""
    from tests.unit.test_dispatcher import dispatch_once, submit

    job = submit(cast, gpus=1, nodes=2)
    dispatch_once()
    attempt = job.attempts.get()
    here = attempt.members.get(node__name="h1")
    token = str(attempt.token)
    for member in attempt.members.all():
        services.attempt_member_started(attempt_id=attempt.pk, rank=member.rank, token=token, pid=1)
    services.attempt_member_finished(
        attempt_id=attempt.pk, rank=here.rank, token=token, exit_code=0, reason=""
    )
    attempt.refresh_from_db()
    assert attempt.state == "running"  # the other member still runs
    tasks.start_attempt(attempt.pk, here.rank, token)
    assert agent.launched == [] and agent.runner.runs == {}
