"""Signed start messages (issue 16's submit-to-running): a dispatcher pass's start message carries
its members' whole assignments, signed with a key only the platform and the agent running the node
hold, so the agent starts them without asking the agent API. Whatever does not verify (a forged
text, another node's or an earlier agent's key, an expired message) is only a hint, confirmed
through the API as before, so a forged message still changes nothing."""

import argparse
import dataclasses
import json
import time

import pytest

from apps.jobs.models import Job
from apps.nodes.credentials import issue_credential, message_key
from apps.nodes.models import Node
from apps.platform import agent_protocol as wire
from apps.scheduling import publish
from tests.agent_http import agent_api
from tests.factories import make_cast, make_node
from tests.unit.test_agent_api import bearer
from tests.unit.test_dispatcher import dispatch_once, submit
from tests.unit.test_runner import Recorder
from workers import current, tasks
from workers.agent import Agent, Config

API = "/internal/agent/v1"
INSTANCE = "agent-instance-1"


@pytest.fixture
def cast(db):
    return make_cast()


@pytest.fixture
def sent(monkeypatch):
    messages: dict[str, tuple[str, dict]] = {}
    monkeypatch.setattr(publish, "_send",
                        lambda task, queue, **kwargs: messages.__setitem__(queue, (task, kwargs)))  # fmt: skip
    return messages


def place(cast, count: int, nodes: dict[str, str], gpus: int = 0) -> list:
    """`count` one-GPU jobs placed on nodes {name: its agent's instance} of `gpus` GPUs each."""
    for name, instance in nodes.items():
        make_node(name, gpus=gpus or count)
        Node.objects.filter(name=name).update(agent_instance=instance)
    jobs = [submit(cast, gpus=1) for _ in range(count)]
    dispatch_once()
    return [Job.objects.get(pk=job.pk).attempts.get() for job in jobs]


def opened(kwargs: dict, node: str, instance: str) -> list[wire.Assignment]:
    key = message_key(node_name=node, agent_instance=instance)
    return wire.open_start_message(key, kwargs["signed"], kwargs["signature"], node=node,
                                   agent_instance=instance, now=time.time())  # fmt: skip


@pytest.mark.django_db(transaction=True)  # the messages go out when the pass commits
def test_a_pass_signs_each_nodes_assignments_as_the_agent_api_would_answer_them(cast, sent):
    attempts = place(cast, 3, {"h1": INSTANCE})
    task, kwargs = sent["node.h1"]
    assert task == "workers.start_attempts"
    works = opened(kwargs, "h1", INSTANCE)
    api = agent_api(issue_credential(node_name="h1")[1])
    answered = api.assignments(attempts=[a.pk for a in attempts])
    assert {(w.attempt_id, w.rank): w for w in works} == answered  # same fields, same values
    assert all(w.active and w.resume_from == "" for w in works)
    # The names ride along for an agent that cannot verify (the hint it confirms by request).
    assert sorted(m["attempt_id"] for m in kwargs["members"]) == sorted(a.pk for a in attempts)


@pytest.mark.django_db(transaction=True)
def test_a_node_no_agent_has_registered_gets_names_only(cast, sent):
    place(cast, 1, {"h1": ""})
    task, kwargs = sent["node.h1"]
    assert (
        task == "workers.start_attempts" and "signed" not in kwargs and len(kwargs["members"]) == 1
    )


@pytest.mark.django_db(transaction=True)
def test_each_node_gets_only_its_own_members_under_its_own_key(cast, sent):
    place(cast, 4, {"h1": "i-1", "h2": "i-2"}, gpus=2)
    assert set(sent) == {"node.h1", "node.h2"}
    for node, instance in (("h1", "i-1"), ("h2", "i-2")):
        kwargs = sent[f"node.{node}"][1]
        works = opened(kwargs, node, instance)
        assert sorted(w.attempt_id for w in works) == sorted(
            m["attempt_id"] for m in kwargs["members"]
        )
    with pytest.raises(wire.BadStartMessage):  # h2's message does not open with h1's key
        opened(sent["node.h2"][1], "h1", "i-1")


def test_the_key_is_the_agents_own():
    key = message_key(node_name="h1", agent_instance="a")
    assert key == message_key(node_name="h1", agent_instance="a")
    assert key != message_key(node_name="h1", agent_instance="b")  # a restarted agent
    assert key != message_key(node_name="h2", agent_instance="a")
    assert len(key) == 32


def test_the_register_answer_hands_the_agent_its_key(db):
    make_node("h1", gpus=1)
    client = bearer(issue_credential(node_name="h1")[1])
    body = {"node": "h1", "agent_instance": INSTANCE, "sku": "H100-80GB",
            "gpus": [{"index": 0, "uuid": "GPU-h1-0"}]}  # fmt: skip
    answer = client.post(f"{API}/register/", body, format="json").json()
    assert bytes.fromhex(answer["message_key"]) == message_key(
        node_name="h1", agent_instance=INSTANCE
    )


# --- the agent ------------------------------------------------------------------------------------


@pytest.fixture
def agent(cast, tmp_path):
    config = Config(url="http://testserver", credential="unused", data_dir=tmp_path)
    agent = Agent(argparse.Namespace(node="h1", sku="H100-80GB", gpus=4, fake=True, labels={}, concurrency=1),
                  config=config, api=agent_api(issue_credential(node_name="h1")[1]))  # fmt: skip
    agent.message_key = message_key(node_name="h1", agent_instance=agent.instance)
    agent.runner.reporter = Recorder()
    current.AGENT = agent
    yield agent
    current.AGENT = None
    agent.runner.kill_all("test over")


@pytest.mark.django_db(transaction=True)
def test_a_signed_start_message_starts_its_members_without_a_request(agent, cast, sent):
    attempts = place(cast, 3, {"h1": agent.instance})
    calls = agent.api.session.calls
    calls.clear()
    tasks.start_attempts(**sent["node.h1"][1])
    assert calls == []
    assert sorted(agent.runner.runs) == sorted((a.pk, 0) for a in attempts)
    assert all(run.process is not None for run in agent.runner.runs.values())


def tampered(kwargs: dict, **change) -> dict:
    data = json.loads(kwargs["signed"])
    data.update(change.pop("top", {}))
    for member in data["members"]:
        member.update(change)
    return {**kwargs, "signed": json.dumps(data)}


def resigned(kwargs: dict, key: bytes, **top) -> dict:
    data = {**json.loads(kwargs["signed"]), **top}
    signed = json.dumps(data)
    return {**kwargs, "signed": signed, "signature": wire.start_message_signature(key, signed)}


@pytest.mark.django_db(transaction=True)
def test_a_message_that_does_not_verify_is_confirmed_with_the_platform(agent, cast, sent):
    """Changed text, another agent's key, expired: each falls back to the request, which starts
    only what the platform has here, as the platform has it (never the message's argv)."""
    (attempt,) = place(cast, 1, {"h1": agent.instance})
    genuine = sent["node.h1"][1]
    earlier_agent = message_key(node_name="h1", agent_instance="the agent before")
    launched = []
    agent.runner.launch = lambda work: launched.append(work)
    for message in (
        tampered(genuine, argv=["sh", "-c", "cat /etc/shadow"]),
        resigned(genuine, earlier_agent),
        resigned(genuine, agent.message_key, expires=time.time() - 1),
        {**genuine, "signature": "0" * 64},
    ):
        calls = agent.api.session.calls
        calls.clear()
        tasks.start_attempts(**message)
        assert len(calls) == 1 and calls[0][1].startswith(f"{API}/assignments/?attempts=")
    platforms = agent.api.assignments(attempts=[attempt.pk])[(attempt.pk, 0)].argv
    assert [w.argv for w in launched] == [platforms] * 4 and "cat /etc/shadow" not in platforms


@pytest.mark.django_db(transaction=True)
def test_a_forged_message_signed_with_another_key_starts_nothing(agent, cast, sent):
    (attempt,) = place(cast, 1, {"h1": agent.instance})
    forged_member = dataclasses.replace(
        wire.assignment_from_wire(json.loads(sent["node.h1"][1]["signed"])["members"][0]),
        token="00000000-0000-0000-0000-000000000000",
        argv=["sh", "-c", "id"],
    )
    forged = wire.signed_start_message(b"a key the forger made up", node="h1", agent_instance=agent.instance,
                                       members=[forged_member], expires=time.time() + 60)  # fmt: skip
    tasks.start_attempts(
        [{"attempt_id": attempt.pk, "rank": 0, "token": forged_member.token}], **forged
    )
    assert agent.runner.runs == {}


@pytest.mark.django_db(transaction=True)  # the messages go out when the pass commits
def test_what_celery_shows_of_a_message_names_no_token(cast, monkeypatch):
    """Celery puts a message's `kwargsrepr` in its headers and in the task-sent event that Flower
    and any event subscriber read: a start or stop message shows its names, never an attempt's
    token (bare, or inside the signed assignments)."""
    options: list[dict] = []
    monkeypatch.setattr(publish.current_app, "send_task", lambda task, **o: options.append(o))
    [attempt] = place(cast, 1, {"n1": INSTANCE})
    publish.publish_stop(attempt, attempt.members.get())
    assert len(options) == 2 and all(o["argsrepr"] == "()" for o in options)
    start, stop = options
    token = str(attempt.token)
    assert token in start["kwargs"]["signed"] and stop["kwargs"]["token"] == token
    for o in options:
        assert token not in o["kwargsrepr"], o["kwargsrepr"]
    assert f"'attempt_id': {attempt.pk}" in start["kwargsrepr"]
    assert "'token': '<hidden>'" in stop["kwargsrepr"]
