"""Batched agent traffic (issue 16's drain rate, issue 18's faster starts and ends): several
members' reports in one call (`POST /internal/agent/v1/reports/`), each item fenced on its own;
one start message per node naming all a pass placed there, checked with one request; and the
agent's reporter coalescing the reports that queue up while a call is in flight."""

import argparse
import threading
import time

import pytest
from django.db import connection
from django.db.models import F

from apps.jobs.models import AttemptMember, GpuAllocation, Job, JobEvent
from apps.nodes.credentials import issue_credential
from apps.platform.agent_protocol import MAX_REPORTS_PER_CALL
from apps.scheduling import publish
from tests.agent_http import agent_api
from tests.factories import make_cast, make_node
from tests.unit.test_agent_api import bearer, fenced, member_url
from tests.unit.test_dispatcher import dispatch_once, submit
from tests.unit.test_runner import Recorder, Work, py
from workers import current, tasks
from workers.agent import Agent, Config
from workers.agent_client import ApiError
from workers.reporter import ReportBatcher
from workers.runner import Runner

API = "/internal/agent/v1"
FORGED = "00000000-0000-0000-0000-000000000000"


@pytest.fixture
def cast(db):
    return make_cast()


def placed(cast, count: int, node_gpus: dict[str, int]) -> list:
    for name, gpus in node_gpus.items():
        make_node(name, gpus=gpus)
    jobs = [submit(cast, gpus=1) for _ in range(count)]
    dispatch_once()
    return [Job.objects.get(pk=job.pk).attempts.get() for job in jobs]


def on(attempts, node: str) -> list:
    return [a for a in attempts if a.members.get().node.name == node]


def item(attempt, kind: str, token: str | None = None, **body) -> dict:
    return {
        "attempt_id": attempt.pk,
        "rank": 0,
        "token": token or str(attempt.token),
        "kind": kind,
        **body,
    }


def post(node: str, reports) -> dict:
    client = bearer(issue_credential(node_name=node)[1])
    response = client.post(f"{API}/reports/", {"reports": reports}, format="json")
    assert response.status_code == 200, response.content
    return response.json()["results"]


# --- the batch endpoint -------------------------------------------------------------------------------


def test_one_call_starts_and_ends_several_members_in_order(cast):
    a, b = placed(cast, 2, {"h1": 2})
    results = post("h1", [item(a, "started", pid=11), item(b, "started", pid=12),
                          item(a, "finished", exit_code=0), item(b, "finished", exit_code=3)])  # fmt: skip
    assert results == [{"status": 200, "accepted": True}] * 4
    states = {str(j.pk): j.state for j in Job.objects.all()}
    assert (states[str(a.job_id)], states[str(b.job_id)]) == ("succeeded", "failed")
    assert AttemptMember.objects.get(attempt=a).pid == 11


def test_a_forged_token_in_one_item_changes_nothing_and_the_others_still_apply(cast):
    a, b = placed(cast, 2, {"h1": 2})
    results = post("h1", [item(a, "started", token=FORGED, pid=11), item(b, "started", pid=12),
                          item(a, "finished", token="not-a-uuid", exit_code=0)])  # fmt: skip
    assert results == [{"status": 404}, {"status": 200, "accepted": True}, {"status": 404}]
    assert AttemptMember.objects.get(attempt=a).state == "starting"
    assert Job.objects.get(pk=a.job_id).state == "starting"
    assert Job.objects.get(pk=b.job_id).state == "running"


def test_another_nodes_member_is_404_per_item(cast):
    attempts = placed(cast, 2, {"h1": 1, "h2": 1})
    (mine,), (theirs,) = on(attempts, "h1"), on(attempts, "h2")
    results = post("h1", [item(theirs, "started", pid=1), item(mine, "started", pid=2),
                          item(theirs, "lost", reason="forged")])  # fmt: skip
    assert results == [{"status": 404}, {"status": 200, "accepted": True}, {"status": 404}]
    assert AttemptMember.objects.get(attempt=theirs).state == "starting"
    assert Job.objects.get(pk=theirs.job_id).state == "starting"


def test_bad_items_are_400_naming_the_field_and_the_rest_apply(cast):
    a, b = placed(cast, 2, {"h1": 2})
    results = post("h1", [{"attempt_id": a.pk, "rank": 0, "token": str(a.token), "kind": "exploded"},
                          item(a, "started", pid=-1), item(b, "started", pid=5),
                          item(b, "finished", exit_code=0, checkpoint="checkpoints/someone-else/x"), "junk"])  # fmt: skip
    assert results[0]["status"] == 400 and "kind" in results[0]["errors"]
    assert results[1]["status"] == 400 and "pid" in results[1]["errors"]
    assert results[2] == {"status": 200, "accepted": True}
    assert results[3]["status"] == 400 and "checkpoint" in results[3]["errors"]
    assert results[4]["status"] == 400
    assert Job.objects.get(pk=b.job_id).state == "running"  # its bad end changed nothing


def test_a_stale_report_is_refused_not_applied(cast):
    (a,) = placed(cast, 1, {"h1": 1})
    first = [item(a, "started", pid=1), item(a, "finished", exit_code=0)]
    assert [r["accepted"] for r in post("h1", first)] == [True, True]
    assert post("h1", [item(a, "finished", exit_code=1)]) == [{"status": 200, "accepted": False}]
    assert Job.objects.get(pk=a.job_id).state == "succeeded"


def test_a_batch_reads_its_members_once_and_each_report_costs_only_its_writes(
    cast, django_assert_max_num_queries
):
    """The credential, the batch's jobs locked and their members read, and its transaction (here
    a savepoint in the test's): five statements for the whole batch (four on SQLite, whose
    transaction is the lock); then each report only its guarded writes and its event, in a
    savepoint. The services used to read the member (and the job, the attempt, the gang) again
    for every report: 36 statements for four starts, 56 for four ends."""
    attempts = placed(cast, 4, {"h1": 4})
    client = bearer(issue_credential(node_name="h1")[1])
    batch = 4 if connection.vendor == "sqlite" else 5
    per_start = 2 + 4  # savepoint and release; member, attempt, job, event
    with django_assert_max_num_queries(batch + 4 * per_start):
        response = client.post(f"{API}/reports/", {"reports": [item(a, "started", pid=7) for a in attempts]},
                               format="json")  # fmt: skip
    assert [r["accepted"] for r in response.json()["results"]] == [True] * 4
    per_end = 2 + 5 + 1  # ... member, GPUs, attempt, job, event; the job's dependents
    with django_assert_max_num_queries(batch + 4 * per_end):
        response = client.post(f"{API}/reports/", {"reports": [item(a, "finished", exit_code=0) for a in attempts]},
                               format="json")  # fmt: skip
    assert [r["accepted"] for r in response.json()["results"]] == [True] * 4
    assert set(Job.objects.values_list("state", flat=True)) == {"succeeded"}


def test_a_gang_starts_and_ends_with_its_last_members_report_across_batches(cast):
    make_node("h1", gpus=1)
    make_node("h2", gpus=1)
    job = submit(cast, gpus=1, nodes=2)
    dispatch_once()
    attempt = Job.objects.get(pk=job.pk).attempts.get()
    rank_on = {m.node.name: m.rank for m in attempt.members.select_related("node")}

    def report(node, kind, **body):
        (result,) = post(node, [{**item(attempt, kind, **body), "rank": rank_on[node]}])
        assert result == {"status": 200, "accepted": True}
        return Job.objects.get(pk=job.pk).state

    assert report("h1", "started", pid=1) == "starting"  # the other member is not up yet
    assert report("h2", "started", pid=2) == "running"
    assert report("h2", "finished", exit_code=0) == "running"  # the other still runs
    assert report("h1", "finished", exit_code=0) == "succeeded"
    assert not GpuAllocation.objects.filter(attempt=attempt, released_at=None).exists()


def test_the_body_must_be_a_bounded_list(cast):
    client = bearer(issue_credential(node_name="h1")[1])
    for body in (
        {},
        {"reports": []},
        {"reports": "x"},
        {"reports": [{}] * (MAX_REPORTS_PER_CALL + 1)},
    ):
        response = client.post(f"{API}/reports/", body, format="json")
        assert response.status_code == 400 and "reports" in response.json()
    assert (
        bearer("gpn_nope.nope")
        .post(f"{API}/reports/", {"reports": [{}]}, format="json")
        .status_code
        == 401
    )


def test_assignments_of_named_attempts_are_this_nodes_only_with_their_resume_point(cast):
    attempts = placed(cast, 2, {"h1": 1, "h2": 1})
    (mine,), (theirs,) = on(attempts, "h1"), on(attempts, "h2")
    api = agent_api(issue_credential(node_name="h1")[1])
    found = api.assignments(attempts=[mine.pk, theirs.pk, 999999])
    assert list(found) == [(mine.pk, 0)]
    assert found[(mine.pk, 0)].resume_from == "" and found[(mine.pk, 0)].token == str(mine.token)
    client = bearer(issue_credential(node_name="h1")[1])
    assert client.get(f"{API}/assignments/?attempts=1,x").status_code == 400


# --- start messages -------------------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)  # the messages go out when the pass commits
def test_a_pass_sends_one_start_message_per_node_naming_all_it_placed_there(cast, monkeypatch):
    sent = []
    monkeypatch.setattr(
        publish, "_send", lambda task, queue, **kwargs: sent.append((task, queue, kwargs))
    )
    attempts = placed(cast, 5, {"h1": 4, "h2": 1})
    by_queue = {queue: (task, kwargs) for task, queue, kwargs in sent}
    assert len(sent) == 2 and set(by_queue) == {"node.h1", "node.h2"}
    task, kwargs = by_queue["node.h1"]
    assert task == "workers.start_attempts"
    assert sorted(m["attempt_id"] for m in kwargs["members"]) == sorted(
        a.pk for a in on(attempts, "h1")
    )
    assert all(m["token"] == str(next(a for a in attempts if a.pk == m["attempt_id"]).token)
               for m in kwargs["members"])  # fmt: skip
    assert by_queue["node.h2"][0] == "workers.start_attempts"  # one member: the same message
    assert [m["attempt_id"] for m in by_queue["node.h2"][1]["members"]] == [
        a.pk for a in on(attempts, "h2")
    ]


@pytest.fixture
def agent(cast, tmp_path):
    config = Config(url="http://testserver", credential="unused", data_dir=tmp_path)
    agent = Agent(argparse.Namespace(node="h1", sku="H100-80GB", gpus=4, fake=True, labels={}, concurrency=1),
                  config=config, api=agent_api(issue_credential(node_name="h1")[1]))  # fmt: skip
    agent.runner.reporter = Recorder()
    current.AGENT = agent
    yield agent
    current.AGENT = None
    agent.runner.kill_all("test over")


def test_a_start_message_for_several_members_starts_every_one_with_one_request(agent, cast):
    attempts = placed(cast, 4, {"h1": 3, "h2": 1})
    mine, (theirs,) = on(attempts, "h1"), on(attempts, "h2")
    members = [{"attempt_id": a.pk, "rank": 0, "token": str(a.token)} for a in mine]
    forged = [{"attempt_id": mine[0].pk, "rank": 1, "token": str(mine[0].token)},  # no such rank
              {"attempt_id": theirs.pk, "rank": 0, "token": str(theirs.token)},  # another node's
              {"attempt_id": mine[1].pk, "rank": 0, "token": FORGED}]  # fmt: skip
    calls = agent.api.session.calls
    calls.clear()
    tasks.start_attempts(members + forged)
    assert len(calls) == 1 and calls[0][1].startswith(f"{API}/assignments/?attempts=")
    assert sorted(agent.runner.runs) == sorted((a.pk, 0) for a in mine)  # each once, none forged
    assert all(run.process is not None for run in agent.runner.runs.values())
    assert [e[0] for e in agent.runner.reporter.events].count("started") == 3


def test_a_start_message_only_forged_starts_nothing(agent, cast):
    (a,) = placed(cast, 1, {"h1": 1})
    tasks.start_attempts([{"attempt_id": a.pk, "rank": 0, "token": FORGED}])
    tasks.start_attempts([{"attempt_id": "x"}])
    tasks.start_attempts("not a list")
    assert agent.runner.runs == {}


# --- the reporter coalesces ------------------------------------------------------------------------


class SlowApi:
    """Stands in for the agent API: each batch call waits until the test lets it answer."""

    def __init__(self, refuse: set | None = None):
        self.batches: list[list[dict]] = []
        self.gate = threading.Event()
        self.refuse = refuse or set()

    def reports(self, items):
        self.batches.append(items)
        self.gate.wait(10)
        return [{"status": 404} if i["attempt_id"] in self.refuse else {"status": 200, "accepted": True}
                for i in items]  # fmt: skip


def work(attempt_id: int) -> Work:
    return Work(argv=["true"], attempt_id=attempt_id)


def test_a_report_made_while_idle_goes_at_once_alone():
    api = SlowApi()
    api.gate.set()
    batcher = ReportBatcher(api)
    started = time.monotonic()
    assert batcher.call(work(1), "started", pid=1) is True
    assert api.batches == [
        [{"attempt_id": 1, "rank": 0, "token": "t", "kind": "started", "pid": 1}]
    ]
    assert time.monotonic() - started < 0.5


def test_reports_made_while_a_call_is_in_flight_go_together_in_the_next():
    api = SlowApi(refuse={4})
    batcher = ReportBatcher(api)
    answers = {}

    def done_for(key):
        return lambda accepted, error: answers.__setitem__(key, (accepted, error))

    batcher.submit(work(1), "started", {"pid": 1}, done_for(1))
    deadline = time.monotonic() + 5
    while not api.batches and time.monotonic() < deadline:
        time.sleep(0.01)
    for attempt_id in (2, 3, 4):  # queued while the first call waits for its answer
        batcher.submit(work(attempt_id), "finished", {"exit_code": 0}, done_for(attempt_id))
    api.gate.set()
    while len(answers) < 4 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert [[i["attempt_id"] for i in batch] for batch in api.batches] == [[1], [2, 3, 4]]
    assert answers == {1: (True, None), 2: (True, None), 3: (True, None), 4: (False, None)}
    assert batcher.calls == 2


def test_a_failed_call_fails_each_report_in_it_and_a_bad_item_fails_alone():
    class Broken:
        def reports(self, items):
            if items[0]["kind"] == "progress":
                raise ApiError("POST /reports/: connection refused")
            return [{"status": 400, "errors": {"pid": ["bad"]}}, {"status": 200, "accepted": True}][
                : len(items)
            ]

    batcher = ReportBatcher(Broken(), retry_delays=(0.01,))
    with pytest.raises(ApiError, match="connection refused"):  # after its one new try
        batcher.call(work(1), "progress", progress=0.5)
    with pytest.raises(ApiError, match="400"):
        batcher.call(work(1), "started", pid=-1)


def test_a_call_that_got_no_answer_is_sent_again_and_a_start_applied_twice_is_accepted(cast):
    """A reset connection (the web closing a keep-alive connection as the call went out) loses
    the answer, not the report: the batch goes again, and the platform accepts a start it had
    already applied, so the runner does not stop a job that runs."""
    (a,) = placed(cast, 1, {"h1": 1})
    client = bearer(issue_credential(node_name="h1")[1])

    class Resetting:
        def __init__(self):
            self.tries = 0

        def reports(self, items):
            self.tries += 1
            response = client.post(f"{API}/reports/", {"reports": items}, format="json")
            if self.tries == 1:  # applied, but the answer never came back
                raise ApiError("POST /reports/: ('Connection aborted.', ConnectionResetError(104))")
            return response.json()["results"]

    api = Resetting()
    batcher = ReportBatcher(api, retry_delays=(0.01, 0.01))
    started = AttemptMember.objects.get(attempt=a)
    assert batcher.call(Work(argv=["true"], attempt_id=a.pk, token=str(a.token)), "started", pid=42)
    assert api.tries == 2
    started.refresh_from_db()
    assert (started.state, started.pid) == ("running", 42)
    assert Job.objects.get(pk=a.job_id).state == "running"
    # Another pid, or a member already ended, is still refused.
    assert post("h1", [item(a, "started", pid=43)]) == [{"status": 200, "accepted": False}]


def test_an_old_control_plane_without_the_batch_endpoint_gets_single_reports():
    class Old:
        def __init__(self):
            self.single = []

        def reports(self, items):
            raise ApiError("POST /reports/: 404 not found", 404)

        def report(self, assignment, kind, **body):
            self.single.append((assignment.attempt_id, kind))
            return True

    api = Old()
    batcher = ReportBatcher(api)
    assert batcher.call(work(7), "started", pid=1) is True
    assert batcher.call(work(7), "finished", exit_code=0) is True
    assert api.single == [(7, "started"), (7, "finished")] and batcher.single


def test_the_runner_reports_a_start_before_its_end_without_waiting_for_either(tmp_path):
    """Through the reporter's later paths: the launcher and the tick go on while calls fly."""

    class Later(Recorder):
        def __init__(self):
            super().__init__()
            self.batcher = ReportBatcher(SlowApi())

        def started_later(self, run, done):
            self.events.append(("started", run.process.pid))
            self.batcher.submit(run.assignment, "started", {"pid": run.process.pid}, done)

        def finished_later(self, run, exit_code, reason, checkpoint, done):
            self.events.append(("finished", exit_code, reason))
            self.batcher.submit(run.assignment, "finished", {"exit_code": exit_code}, done)

    reporter = Later()
    runner = Runner(node="n1", data_dir=tmp_path, reporter=reporter, kill_grace=1.0)
    for attempt_id in (1, 2, 3):
        runner.launch(
            Work(argv=py("pass"), attempt_id=attempt_id)
        )  # returns: not waiting on the web
    assert {k for k, _ in runner.runs} == {1, 2, 3}
    deadline = time.monotonic() + 10
    while runner.runs and time.monotonic() < deadline:
        if time.monotonic() > deadline - 9:
            reporter.batcher.api.gate.set()  # the web answers
        runner.tick()
        time.sleep(0.05)
    assert runner.runs == {} and sorted(runner.ended) == [(1, 0), (2, 0), (3, 0)]
    kinds = [[(i["attempt_id"], i["kind"]) for i in b] for b in reporter.batcher.api.batches]
    flat = [entry for batch in kinds for entry in batch]
    for attempt_id in (1, 2, 3):
        assert flat.index((attempt_id, "started")) < flat.index((attempt_id, "finished"))
    assert len(kinds) < len(flat)  # some went together


def test_the_heartbeat_lists_each_member_with_its_resume_point_so_a_late_start_costs_no_request(
    cast,
):
    from apps.jobs.models import JobAttempt
    from apps.nodes.models import Node

    a, b = placed(cast, 2, {"h1": 2})
    JobAttempt.objects.filter(pk=b.pk).update(
        checkpoint=f"checkpoints/{b.job_id}/attempt-1/rank-0/ckpt"
    )
    Node.objects.filter(name="h1").update(agent_instance="i1")
    api = agent_api(issue_credential(node_name="h1")[1])
    members = api.heartbeat(agent_instance="i1", gpus=[])
    assert members[(a.pk, 0)].resume_from == ""
    assert members[(b.pk, 0)].resume_from == f"checkpoints/{b.job_id}/attempt-1/rank-0/ckpt"
    assert api.assignments()[(b.pk, 0)].resume_from == members[(b.pk, 0)].resume_from


def test_an_unchanged_members_list_is_not_sent_again_and_any_change_is(cast):
    from apps.jobs import services
    from apps.nodes.models import Node

    a, b = placed(cast, 2, {"h1": 2})
    Node.objects.filter(name="h1").update(agent_instance="i1")
    api = agent_api(issue_credential(node_name="h1")[1])
    first = api.heartbeat(agent_instance="i1", gpus=[])
    calls = api.session.calls
    answers = []
    real = api.session.request

    def recording(*args, **kwargs):
        response = real(*args, **kwargs)
        answers.append(response.json())
        return response

    api.session.request = recording
    assert api.heartbeat(agent_instance="i1", gpus=[]) == first
    assert answers[-1]["unchanged"] is True and answers[-1]["members"] == []
    services.job_cancel(job=Job.objects.get(pk=a.job_id), actor="test")  # a stop is asked: changed
    after_cancel = api.heartbeat(agent_instance="i1", gpus=[])
    assert "unchanged" not in answers[-1] and after_cancel[(a.pk, 0)].stop_requested == "cancel"
    services.attempt_member_started(attempt_id=b.pk, rank=0, token=str(b.token), pid=1)
    services.attempt_member_finished(attempt_id=b.pk, rank=0, token=str(b.token), exit_code=0)
    assert set(api.heartbeat(agent_instance="i1", gpus=[])) == {(a.pk, 0)}  # b ended: changed
    assert api.heartbeat(agent_instance="i1", gpus=[]) == api.heartbeat(
        agent_instance="i1", gpus=[]
    )
    assert answers[-1]["unchanged"] is True and len(calls) >= 5
    # A made-up digest gets the whole list, as an old agent that sends none does.
    client = bearer(issue_credential(node_name="h1")[1])
    answer = client.post(
        f"{API}/heartbeat/", {"agent_instance": "i1", "members_digest": "f" * 32}, format="json"
    )
    assert "unchanged" not in answer.json() and len(answer.json()["members"]) == 1
    old = client.post(f"{API}/heartbeat/", {"agent_instance": "i1"}, format="json").json()
    assert len(old["members"]) == 1 and old["members_digest"] == answer.json()["members_digest"]


def test_a_waited_report_goes_after_what_was_queued_before_it():
    from workers.reporter import _Pending

    api = SlowApi()
    api.gate.set()
    batcher = ReportBatcher(api)
    answered = []
    # A start queued an instant before its sender thread took it; the end is reported, waited for.
    batcher._pending.append(_Pending(work(1), "started", {"pid": 1}, lambda *a: answered.append(a)))
    assert batcher.call(work(1), "finished", exit_code=0) is True
    assert [(i["attempt_id"], i["kind"]) for i in api.batches[0]] == [
        (1, "started"),
        (1, "finished"),
    ]
    assert answered == [(True, None)]


def test_a_batch_of_ends_asks_for_one_dispatch_pass(
    cast, monkeypatch, django_capture_on_commit_callbacks
):
    """Each end asks for a dispatcher pass (a Redis round trip each); a batch asks once."""
    from apps.scheduling import tasks as scheduling_tasks

    attempts = placed(cast, 3, {"h1": 3})
    asked = []
    monkeypatch.setattr(
        scheduling_tasks, "request_dispatch", lambda after_submit=False: asked.append(1)
    )
    with django_capture_on_commit_callbacks(execute=True):
        results = post("h1", [item(a, "started", pid=1 + i) for i, a in enumerate(attempts)]
                       + [item(a, "finished", exit_code=0) for a in attempts])  # fmt: skip
    assert [r["accepted"] for r in results] == [True] * 6
    assert len(asked) == 1
    assert set(Job.objects.values_list("state", flat=True)) == {"succeeded"}


# --- starts and ends together (apps/jobs/batch_reports.py) ---------------------------------------


def statements_of(client, reports, django_assert_max_num_queries, limit: int) -> list:
    with django_assert_max_num_queries(limit):
        response = client.post(f"{API}/reports/", {"reports": reports}, format="json")
    return [r["accepted"] for r in response.json()["results"]]


def test_a_batch_of_plain_starts_and_clean_ends_costs_the_same_statements_for_8_jobs_as_for_1(
    cast, django_assert_max_num_queries
):
    """The credential, the lock and the members' read, a savepoint; for the starts one guarded
    update each of the members, attempts and jobs and one insert of the events; for the ends
    the same and the GPUs' release (no read of dependents: the members' read found none waiting
    on these jobs). One report at a time this was 6 statements a start and 8 an end (36 and 56
    for four jobs)."""
    attempts = placed(cast, 9, {"h1": 9})
    client = bearer(issue_credential(node_name="h1")[1])
    batch = 4 if connection.vendor == "sqlite" else 5
    starts, ends = 2 + 4, 2 + 5
    for group in (attempts[:1], attempts[1:]):
        reports = [item(a, "started", pid=7) for a in group]
        assert statements_of(client, reports, django_assert_max_num_queries, batch + starts) == [
            True
        ] * len(group)
        reports = [item(a, "finished", exit_code=0) for a in group]
        assert statements_of(client, reports, django_assert_max_num_queries, batch + ends) == [
            True
        ] * len(group)
    assert set(Job.objects.values_list("state", flat=True)) == {"succeeded"}
    assert not GpuAllocation.objects.filter(released_at=None).exists()
    moves = list(
        JobEvent.objects.filter(kind="state", actor="agent:h1").values_list(
            "job_id", "from_state", "to_state"
        )
    )
    for a in attempts:  # every move has its audit event, once
        assert [m[1:] for m in moves if m[0] == a.job_id] == [
            ("starting", "running"),
            ("running", "succeeded"),
        ]


def test_a_start_and_an_end_of_one_member_in_one_batch_apply_in_order(cast):
    a, b = placed(cast, 2, {"h1": 2})
    results = post("h1", [item(a, "started", pid=3), item(b, "started", pid=4), item(a, "finished", exit_code=0),
                          item(b, "finished", exit_code=0), item(a, "started", pid=3)])  # fmt: skip
    assert results == [{"status": 200, "accepted": True}] * 4 + [{"status": 200, "accepted": False}]
    assert set(Job.objects.values_list("state", flat=True)) == {"succeeded"}
    assert AttemptMember.objects.get(attempt=a).pid == 3


def test_a_row_that_moved_since_it_was_read_sends_the_batch_one_by_one(cast, monkeypatch, caplog):
    """A job changed by another writer between the batch's read and its write (its version
    moved): the batch's guarded update changes fewer rows than it names, nothing of it is kept,
    and each report is applied alone, where that job's guarded move refuses and the others pass."""
    from apps.jobs import services
    from apps.nodes import agent_reports

    a, b, c = placed(cast, 3, {"h1": 3})
    read = services.lock_reported_members

    def read_then_moved(**kwargs):
        found = read(**kwargs)
        Job.objects.filter(pk=b.job_id).update(version=F("version") + 1)  # another writer's
        return found

    monkeypatch.setattr(agent_reports.jobs, "lock_reported_members", read_then_moved)
    with caplog.at_level("INFO", logger="apps.jobs.batch_reports"):
        results = post("h1", [item(x, "started", pid=1) for x in (a, b, c)])
    assert "applied one by one" in caplog.text
    assert results == [{"status": 200, "accepted": True}] * 3  # b's member started, as one by one
    states = {j.pk: j.state for j in Job.objects.all()}
    assert (states[a.job_id], states[b.job_id], states[c.job_id]) == (
        "running",
        "starting",
        "running",
    )
    assert JobEvent.objects.filter(job_id=b.job_id, to_state="running").count() == 0
    assert JobEvent.objects.filter(job_id__in=[a.job_id, c.job_id], to_state="running").count() == 2


# --- a quick job's start and clean end in one call (members_ran_together) -----------------------


def test_a_calls_start_and_clean_end_of_one_job_cost_one_write_of_each_row_even_alone(
    cast, django_assert_max_num_queries
):
    """A drain's agents send a quick job's end behind its start, mostly one job a call: the
    lock and the members' read (which says whether a dependency waits on the job: none here,
    so no read of dependents); one guarded update each of the member, its GPUs, its attempt and
    its job, one insert of both audit events, and no savepoint (a refusal runs the call again
    without groups). Through the two services one after the other it was 14 after the read (two
    savepoints, the start's 4, the end's 6); with a savepoint, 8; with the dependents' read, 6
    (SQLite) and 2 (PostgreSQL)."""
    attempts = placed(cast, 4, {"h1": 4})
    client = bearer(issue_credential(node_name="h1")[1])
    batch = 4 if connection.vendor == "sqlite" else 5
    # member, GPUs, attempt, job, events (on PostgreSQL one statement: batch_reports._Writes)
    ran = 5 if connection.vendor == "sqlite" else 1
    for group in (attempts[:1], attempts[1:]):
        reports = [item(a, "started", pid=7) for a in group]
        reports += [item(a, "finished", exit_code=0) for a in group]
        with django_assert_max_num_queries(batch + ran):
            response = client.post(f"{API}/reports/", {"reports": reports}, format="json")
        assert [r["accepted"] for r in response.json()["results"]] == [True] * (2 * len(group))
    assert set(Job.objects.values_list("state", flat=True)) == {"succeeded"}


def test_a_lone_start_and_a_lone_end_go_the_groups_way_without_a_savepoint(
    cast, django_assert_max_num_queries
):
    """A drain's other calls: a start whose job did not end within the agent's window, an end
    on its own. Each goes as a group of one: its writes and no savepoint, two statements fewer
    than its service (the start's 6 with the savepoint, the end's 8); on PostgreSQL its updates
    and its events are one statement. No read of dependents: none waits on the job."""
    (a,) = placed(cast, 1, {"h1": 1})
    client = bearer(issue_credential(node_name="h1")[1])
    batch = 4 if connection.vendor == "sqlite" else 5
    start, end = (4, 5) if connection.vendor == "sqlite" else (1, 1)
    for report, writes in (
        (item(a, "started", pid=7), start),
        (item(a, "finished", exit_code=0), end),
    ):
        with django_assert_max_num_queries(batch + writes):  # the credential's read may be cached
            response = client.post(f"{API}/reports/", {"reports": [report]}, format="json")
        assert response.json()["results"] == [{"status": 200, "accepted": True}]
    assert outcome(a)["job"][0] == "succeeded"


def test_a_quick_jobs_start_and_end_meeting_a_moved_row_keep_nothing_of_the_group(
    cast, monkeypatch, caplog
):
    """Another writer moved one job's attempt between the call's first read and its write: the
    group's writes (on PostgreSQL one statement, which changed the other rows before it counted)
    are all rolled back, and the call runs again with each report through its service, which
    read the rows afresh: both jobs' moves once each, their events once."""
    from apps.jobs import services
    from apps.jobs.models import JobAttempt
    from apps.nodes import agent_reports

    a, b = placed(cast, 2, {"h1": 2})
    read, reads = services.lock_reported_members, []

    def read_then_moved(**kwargs):
        found = read(**kwargs)
        if not reads:  # the first try's read only
            JobAttempt.objects.filter(pk=b.pk).update(version=F("version") + 1)
        reads.append(1)
        return found

    monkeypatch.setattr(agent_reports.jobs, "lock_reported_members", read_then_moved)
    with caplog.at_level("INFO", logger="apps.jobs.batch_reports"):
        results = post("h1", [item(a, "started", pid=1), item(a, "finished", exit_code=0),
                              item(b, "started", pid=2), item(b, "finished", exit_code=0)])  # fmt: skip
    assert "applied one by one" in caplog.text and len(reads) == 2
    assert results == [{"status": 200, "accepted": True}] * 4
    for attempt, pid in ((a, 1), (b, 2)):
        done = outcome(attempt)
        assert done["member"] == ("succeeded", pid, 0, True, True)
        assert done["job"][0] == "succeeded" and done["gpus held"] == 0
        assert [e[:2] for e in done["events"]] == [
            ("starting", "running"),
            ("running", "succeeded"),
        ]


def outcome(attempt) -> dict:
    """What a job's start and end leave in the rows, without the times and ids that differ from
    one job to another."""
    member = AttemptMember.objects.select_related("attempt__job").get(attempt=attempt)
    attempt, job = member.attempt, member.attempt.job
    events = JobEvent.objects.filter(job=job, kind="state", actor="agent:h1").order_by("pk")
    return {
        "member": (member.state, member.pid, member.exit_code, bool(member.started_at),
                   bool(member.ended_at)),
        "attempt": (attempt.state, attempt.version, attempt.exit_code, attempt.reason,
                    bool(attempt.started_at), bool(attempt.ended_at), bool(attempt.lease_expires_at)),
        "job": (job.state, job.version, job.exit_code, job.progress, job.reason, bool(job.started_at),
                bool(job.finished_at)),
        "events": [(e.from_state, e.to_state, e.reason, e.attempt_id == attempt.pk) for e in events],
        "gpus held": GpuAllocation.objects.filter(attempt=attempt, released_at=None).count(),
    }  # fmt: skip


def test_a_start_and_clean_end_written_at_once_leave_what_the_two_services_leave(cast):
    together, alone, grouped = placed(cast, 3, {"h1": 3})
    post("h1", [item(together, "started", pid=9), item(together, "finished", exit_code=0)])
    assert GpuAllocation.objects.filter(attempt=alone, released_at=None).count() == 1  # not its
    client = bearer(issue_credential(node_name="h1")[1])  # the single endpoints: the services
    for kind, body in (("started", {"pid": 9}), ("finished", {"exit_code": 0})):
        answer = client.post(member_url(alone, f"{kind}/"), body, format="json", **fenced(alone))
        assert answer.json() == {"accepted": True}
    post("h1", [item(grouped, "started", pid=9)])  # a start and an end each a group of one
    post("h1", [item(grouped, "finished", exit_code=0)])
    assert outcome(together) == outcome(alone) == outcome(grouped)
    assert outcome(together)["events"] == [
        ("starting", "running", "all members started", True),
        ("running", "succeeded", "exit code 0", True),
    ]


def test_a_start_with_an_unclean_end_behind_it_is_not_written_at_once(cast):
    a, b = placed(cast, 2, {"h1": 2})
    results = post("h1", [item(a, "started", pid=1), item(a, "finished", exit_code=2),
                          item(b, "started", pid=2), item(b, "finished", exit_code=0, reason="timeout")])  # fmt: skip
    assert results == [{"status": 200, "accepted": True}] * 4
    assert {j.pk: j.state for j in Job.objects.all()} == {a.job_id: "failed", b.job_id: "failed"}


class Crash(BaseException):
    """The web process dying mid-call (not an error the batch path catches)."""


def test_a_call_cut_short_after_its_writes_leaves_nothing_and_its_retry_everything(
    cast, monkeypatch
):
    """The call is one transaction: a crash after the batch wrote the rows (before the commit)
    keeps none of it, and the agent's retry of the same call (workers/reporter.py retries one
    that got no answer) applies the job's start, its end, its exit code, both audit events and
    its GPUs' release once."""
    from apps.jobs import batch_reports

    a, b = placed(cast, 2, {"h1": 2})
    reports = [item(a, "started", pid=4), item(a, "finished", exit_code=0),
               item(b, "started", pid=5), item(b, "finished", exit_code=0)]  # fmt: skip
    dispatch = batch_reports.trigger_dispatch

    def crash() -> None:
        raise Crash

    monkeypatch.setattr(batch_reports, "trigger_dispatch", crash)
    with pytest.raises(Crash):
        post("h1", reports)
    assert set(AttemptMember.objects.values_list("state", flat=True)) == {"starting"}
    assert set(Job.objects.values_list("state", flat=True)) == {"starting"}
    assert not JobEvent.objects.filter(actor="agent:h1").exists()
    assert GpuAllocation.objects.filter(released_at=None).count() == 2
    monkeypatch.setattr(batch_reports, "trigger_dispatch", dispatch)
    assert post("h1", reports) == [{"status": 200, "accepted": True}] * 4
    for attempt, pid in ((a, 4), (b, 5)):
        done = outcome(attempt)
        assert done["member"] == ("succeeded", pid, 0, True, True)
        assert (done["job"][0], done["job"][2]) == ("succeeded", 0)
        assert [e[:2] for e in done["events"]] == [
            ("starting", "running"),
            ("running", "succeeded"),
        ]
        assert done["gpus held"] == 0
    assert (
        post("h1", reports) == [{"status": 200, "accepted": False}] * 4
    )  # a second retry: nothing
    assert JobEvent.objects.filter(actor="agent:h1").count() == 4


@pytest.mark.skipif(
    "connection.vendor != 'postgresql'", reason="prepared statements are PostgreSQL's"
)
def test_a_groups_one_statement_is_prepared_on_postgresql(cast):
    """The group's updates travel as arrays, so their one statement (batch_reports._Writes) has
    the same text for any group of its shape: psycopg prepares it on its 6th run
    (prepare_threshold 5) and the server stops parsing and planning it."""
    statements = prepared_after_seven_starts(cast)
    assert any('WITH u0 AS (UPDATE "jobs_attemptmember"' in s for s in statements), statements


def prepared_after_seven_starts(cast) -> list[str]:
    """The server's prepared statements after seven lone starts, each in its own report call."""
    attempts = placed(cast, 7, {"h1": 4, "h2": 3})
    for a in attempts:
        node = AttemptMember.objects.get(attempt=a).node.name
        assert post(node, [item(a, "started", pid=7)]) == [{"status": 200, "accepted": True}]
    with connection.cursor() as cursor:
        cursor.execute("SELECT statement FROM pg_prepared_statements")
        return [statement for (statement,) in cursor.fetchall()]
