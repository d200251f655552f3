"""Job arrays through the API and the dispatcher (docs/arrays.md): lazy tasks, %N, counts,
cancel-all, requeue-failed, quotas, other tenants."""

import uuid

import pytest
from django.db import connection, transaction

from apps.jobs.models import GpuAllocation, Job, JobArray, JobAttempt, JobEvent
from apps.jobs.selectors import assignment_for
from apps.jobs.services import attempt_member_finished, attempt_member_started
from apps.scheduling.dispatcher import dispatch_once
from apps.scheduling.reconcile import reconcile_once
from apps.tenants.models import Tenant
from apps.tenants.services import quota_set
from tests.factories import client_for, make_cast, make_node

TRAIN = {"template": "demo-train", "params": {"steps": 2}, "gpus": 1, "gpu_sku": "H100-80GB"}


def submit(client, **body):
    return client.post("/api/v1/jobs/", {**TRAIN, **body}, format="json")


def finish(job: Job, exit_code: int = 0) -> None:
    attempt = job.attempts.order_by("-number").first()
    token = str(attempt.token)
    attempt_member_started(attempt_id=attempt.pk, rank=0, token=token, pid=1)
    attempt_member_finished(attempt_id=attempt.pk, rank=0, token=token, exit_code=exit_code)


def placed(array_id) -> list[Job]:
    return list(
        Job.objects.filter(array_id=array_id, state__in=["starting", "running", "preempting"])
    )


def test_a_submit_with_array_answers_with_the_array_and_makes_one_row(as_user):
    quota_set(tenant=Tenant.objects.get(slug="acme"), max_queued_jobs=20_000)
    answer = submit(as_user("bob"), array="0-9999%16")
    assert answer.status_code == 201, answer.content
    body = answer.json()
    assert body["size"] == 10_000 and body["throttle"] == 16 and body["array"] == "0-9999%16"
    assert body["counts"]["queued"] == 10_000 and body["progress"] == 0
    assert body["tasks_url"] == f"/api/v1/jobs/?array={body['id']}"
    assert body["state"] == "active"
    assert Job.objects.filter(array_id=body["id"]).count() == 1  # its first task only
    assert as_user("bob").get(f"/api/v1/arrays/{body['id']}/").json()["counts"]["queued"] == 10_000
    assert [a["id"] for a in as_user("alice").get("/api/v1/arrays/").json()["results"]] == [
        body["id"]
    ]


def test_the_201_answer_is_what_a_get_of_the_array_says(as_user):
    """The 201 is built without counting the new array's tasks (all queued, none read)."""
    created = submit(as_user("bob"), array="0-99%4", name="sweep")
    assert created.status_code == 201, created.content
    fetched = as_user("bob").get(f"/api/v1/arrays/{created.json()['id']}/")
    assert created.json() == fetched.json()


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"array": ""}, "array"),
        ({"array": "9-1"}, "array"),
        ({"array": "-1"}, "array"),
        ({"array": "0-9%0"}, "array"),
        ({"array": "0-100000"}, "array"),
        ({"array": "1,1"}, "array"),
        ({"array": "zz"}, "array"),
        ({"array": 5}, "array"),
        ({"array": "0-1", "array_grid": {"nope": [1, 2]}}, "array_grid"),
        ({"array": "0-1", "array_grid": {"steps": ["x", "y"]}}, "array_grid"),
        ({"array": "0-2", "array_grid": {"steps": [1, 2]}}, "array_grid"),
        ({"array_grid": []}, "array_grid"),
        ({"array": "0-1", "array_params": [{"steps": 1}]}, "array_params"),
        ({"array": "0-1", "array_params": [{"steps": 1}, {"bogus": 2}]}, "array_params"),
        ({"array_params": "x"}, "array_params"),
        ({"array_params": [{"steps": 1}], "array_grid": {"steps": [1]}}, "array_grid"),
    ],
)
def test_bad_arrays_are_400_naming_the_field(as_user, body, field):
    answer = submit(as_user("bob"), **body)
    assert answer.status_code == 400, answer.content
    assert field in answer.json(), answer.json()
    assert not JobArray.objects.exists() and not Job.objects.exists()


def test_the_grid_gives_each_task_its_point_and_the_spec_may_be_left_out(as_user):
    answer = submit(as_user("bob"), params={"steps": 3}, array_grid={"steps": [1, 2], "seed": [7, 8, 9]} and
                    {"steps": [1, 2], "lr": [0.1, 0.2, 0.3]})  # fmt: skip
    assert answer.status_code == 400  # lr is no param of demo-train
    answer = submit(as_user("bob"), array_grid={"steps": [5, 6, 7]})
    assert answer.status_code == 201, answer.content
    assert answer.json()["array"] == "0-2" and answer.json()["size"] == 3
    tasks = as_user("bob").get(answer.json()["tasks_url"]).json()["results"]
    assert [t["params"]["steps"] for t in tasks] == [5, 6, 7]
    assert [t["array_index"] for t in tasks] == [0, 1, 2]


def test_tasks_are_listed_rows_and_virtual_alike_in_index_order_with_stable_ids(as_user):
    array = submit(
        as_user("bob"), array="1,3-11:2,40%2", array_params=[{"steps": n} for n in range(1, 8)]
    ).json()
    url = array["tasks_url"]
    listed = as_user("bob").get(url + "&page_size=5").json()
    assert listed["count"] == 7 and listed["next"] and listed["previous"] is None
    second = as_user("bob").get(listed["next"]).json()
    tasks = listed["results"] + second["results"]
    assert [t["array_index"] for t in tasks] == [1, 3, 5, 7, 9, 11, 40]
    assert [t["params"]["steps"] for t in tasks] == list(range(1, 8))
    assert {t["state"] for t in tasks} == {"queued"} and all(
        t["array"] == array["id"] for t in tasks
    )
    ids = [t["id"] for t in tasks]
    assert ids == [str(uuid.uuid5(uuid.UUID(array["id"]), str(i))) for i in [1, 3, 5, 7, 9, 11, 40]]
    dispatch_once()  # two placed (%2), a few more made queued rows
    assert Job.objects.filter(array_id=array["id"]).count() >= 2
    again = as_user("bob").get(url + "&page_size=100").json()["results"]
    assert [t["id"] for t in again] == ids  # a task's row took the id it was listed with
    assert [t["created_at"] for t in again] == [t["created_at"] for t in tasks]  # and its place
    assert sorted(t["created_at"] for t in tasks) == [t["created_at"] for t in tasks]  # index order
    assert [t["state"] for t in again].count("starting") == 2
    only = as_user("bob").get(url + "&state=starting").json()
    assert only["count"] == 2 and [t["array_index"] for t in only["results"]] == [1, 3]
    assert as_user("bob").get(url + "&state=queued").json()["count"] == 5
    assert as_user("bob").get(url + "&state=nope").status_code == 400
    assert as_user("bob").get(url + "&page_size=0").status_code == 400
    assert as_user("bob").get("/api/v1/jobs/?array=not-a-uuid").status_code == 400
    job = as_user("bob").get(f"/api/v1/jobs/{ids[0]}/").json()
    assert job["array"] == array["id"] and job["array_index"] == 1


def test_throttle_is_never_exceeded_and_the_array_ends_with_every_task_succeeded(as_user):
    array = submit(as_user("bob"), array="0-19%3").json()
    most = 0
    for _ in range(40):
        dispatch_once()
        running = placed(array["id"])
        most = max(most, len(running))
        assert len(running) <= 3
        for job in running:
            finish(job)
        if not Job.objects.filter(array_id=array["id"]).exclude(state="succeeded").exists() and \
                JobArray.objects.get(pk=array["id"]).materialised == 20:  # fmt: skip
            break
    assert most == 3
    body = as_user("bob").get(f"/api/v1/arrays/{array['id']}/").json()
    assert body["counts"]["succeeded"] == 20 and body["progress"] == 1 and body["state"] == "ended"
    held = JobAttempt.objects.filter(job__array_id=array["id"], state="starting")
    assert not held.exists()
    ended = JobEvent.objects.filter(kind="array", data__array=array["id"])
    assert ended.count() == 1  # the array's end, once
    assert ended.get().data["counts"]["succeeded"] == 20


def test_the_array_ends_when_its_last_two_tasks_end_at_once_in_transactions_of_their_own(
    as_user, django_capture_on_commit_callbacks
):
    """CI's e2e array (2026-12-06) stayed `active` with all 200 tasks succeeded: two agents'
    reports ended the last two tasks in two transactions, and each one's check saw the other
    task still running. Here: task a ends while task b is running; b's end commits meanwhile
    (its own check had seen a running). a's check, made again after a's commit, ends the array."""
    array = submit(as_user("bob"), array="0-1").json()
    dispatch_once()
    a, b = sorted(placed(array["id"]), key=lambda job: job.array_index)
    with django_capture_on_commit_callbacks(execute=True):
        with transaction.atomic():
            finish(a)
            assert JobArray.objects.get(pk=array["id"]).ended_at is None  # b is running
            Job.objects.filter(pk=b.pk).update(state="succeeded")  # another transaction's end
    assert as_user("bob").get(f"/api/v1/arrays/{array['id']}/").json()["state"] == "ended"
    assert JobEvent.objects.filter(kind="array", data__array=array["id"]).count() == 1


def test_the_reconcile_tick_ends_an_array_whose_end_was_never_recorded(as_user):
    array = submit(as_user("bob"), array="0-2").json()
    dispatch_once()
    for job in placed(array["id"]):
        finish(job)
    assert reconcile_once()["arrays_ended"] == 0  # it ended with its last task
    JobArray.objects.filter(pk=array["id"]).update(ended_at=None)  # as if that end were lost
    JobEvent.objects.filter(kind="array").delete()
    assert reconcile_once()["arrays_ended"] == 1
    assert reconcile_once()["arrays_ended"] == 0
    assert as_user("bob").get(f"/api/v1/arrays/{array['id']}/").json()["state"] == "ended"
    assert JobEvent.objects.filter(kind="array", data__array=array["id"]).count() == 1


def test_a_task_over_the_throttle_waits_with_a_reason(as_user):
    array = submit(as_user("bob"), array="0-9%2").json()
    dispatch_once()
    dispatch_once()
    assert len(placed(array["id"])) == 2
    waiting = Job.objects.filter(array_id=array["id"], state="queued").first()
    assert waiting is None or "%2" in waiting.reason or waiting.reason


def test_each_task_sees_its_index_and_its_params(as_user):
    array = submit(
        as_user("bob"), array="4,6", params={"steps": 9}, array_params=[{}, {"steps": 3}]
    ).json()
    dispatch_once()
    tasks = {j.array_index: j for j in Job.objects.filter(array_id=array["id"])}
    assert tasks[4].params["steps"] == 9 and tasks[6].params["steps"] == 3
    member = tasks[6].attempts.get().members.get()
    assert assignment_for(member).array_index == 6


def test_cancel_ends_every_task_and_frees_every_gpu(as_user):
    array = submit(as_user("bob"), array="0-99").json()
    dispatch_once()
    running = placed(array["id"])
    assert len(running) == 8  # the node's 8 GPUs
    for job in running[:4]:
        attempt = job.attempts.get()
        attempt_member_started(attempt_id=attempt.pk, rank=0, token=str(attempt.token), pid=1)
    answer = as_user("bob").post(f"/api/v1/arrays/{array['id']}/cancel/")
    assert answer.status_code == 200, answer.content
    assert answer.json()["counts"]["cancelled"] == 100 and answer.json()["state"] == "cancelled"
    assert not Job.objects.filter(array_id=array["id"]).exclude(state="cancelled").exists()
    for job in running:  # the agents stop them and report the process trees gone
        attempt = job.attempts.get()
        assert attempt.stop_requested == "cancel"
        attempt_member_finished(
            attempt_id=attempt.pk, rank=0, token=str(attempt.token), exit_code=-15
        )
    assert not GpuAllocation.objects.filter(released_at=None).exists()
    dispatch_once()
    assert (
        Job.objects.filter(array_id=array["id"]).count()
        == JobArray.objects.get(pk=array["id"]).materialised
    )
    assert not placed(array["id"])  # nothing more is started or made
    listed = as_user("bob").get(array["tasks_url"] + "&state=cancelled").json()
    assert listed["count"] == 100
    assert (
        as_user("bob").post(f"/api/v1/arrays/{array['id']}/cancel/").status_code == 400
    )  # as a job's
    assert JobEvent.objects.filter(kind="array", data__array=array["id"]).count() == 1


def test_requeue_failed_puts_failed_tasks_back(as_user):
    array = submit(as_user("bob"), array="0-3").json()
    dispatch_once()
    tasks = sorted(placed(array["id"]), key=lambda j: j.array_index)
    assert len(tasks) == 4
    for job in tasks:
        finish(job, exit_code=0 if job.array_index % 2 else 1)
    body = as_user("bob").get(f"/api/v1/arrays/{array['id']}/").json()
    assert (
        body["counts"]["failed"] == 2
        and body["counts"]["succeeded"] == 2
        and body["state"] == "ended"
    )
    answer = as_user("bob").post(f"/api/v1/arrays/{array['id']}/requeue-failed/")
    assert answer.status_code == 200
    assert answer.json()["counts"]["queued"] == 2 and answer.json()["state"] == "active"
    dispatch_once()
    for job in placed(array["id"]):
        finish(job)
    body = as_user("bob").get(f"/api/v1/arrays/{array['id']}/").json()
    assert body["counts"]["succeeded"] == 4 and body["state"] == "ended"
    assert (
        JobEvent.objects.filter(kind="array", data__array=array["id"]).count() == 2
    )  # it ended twice


def test_other_tenants_get_404(as_user):
    array = submit(as_user("bob"), array="0-3").json()
    dave = as_user("dave")
    assert dave.get(f"/api/v1/arrays/{array['id']}/").status_code == 404
    assert dave.post(f"/api/v1/arrays/{array['id']}/cancel/").status_code == 404
    assert dave.post(f"/api/v1/arrays/{array['id']}/requeue-failed/").status_code == 404
    assert dave.get(f"/api/v1/jobs/?array={array['id']}").status_code == 404
    assert dave.get("/api/v1/arrays/").json()["results"] == []
    assert (
        as_user("carol").post(f"/api/v1/arrays/{array['id']}/cancel/").status_code == 403
    )  # a viewer
    assert as_user("bob").get(f"/api/v1/arrays/{uuid.uuid4()}/").status_code == 404


def test_an_array_over_the_queued_cap_is_refused_whole(as_user):
    quota_set(tenant=Tenant.objects.get(slug="acme"), max_queued_jobs=50)
    answer = submit(as_user("bob"), array="0-50")
    assert answer.status_code == 429 and int(answer["Retry-After"]) > 0
    assert "refused whole" in str(answer.json())
    assert not JobArray.objects.exists() and not Job.objects.exists()
    assert submit(as_user("bob"), array="0-39").status_code == 201
    # The first array's virtual tasks count: 40 queued, 11 more would pass 50.
    assert submit(as_user("bob"), array="0-10").status_code == 429
    assert submit(as_user("bob"), array="0-9").status_code == 201


def test_an_idempotent_replay_answers_with_the_same_array(as_user):
    client = as_user("bob")
    first = client.post(
        "/api/v1/jobs/", {**TRAIN, "array": "0-9"}, format="json", HTTP_IDEMPOTENCY_KEY="k1"
    )
    again = client.post(
        "/api/v1/jobs/", {**TRAIN, "array": "0-9"}, format="json", HTTP_IDEMPOTENCY_KEY="k1"
    )
    assert first.status_code == 201 and again.status_code == 200
    assert first.json()["id"] == again.json()["id"] and JobArray.objects.count() == 1


def test_webhooks_and_the_task_stream_report_the_arrays_end_once(as_user):
    from datetime import timedelta

    from django.utils import timezone

    from apps.jobs.event_hub import Cursor, state_events
    from apps.webhooks import services as webhooks
    from apps.webhooks.models import Webhook, WebhookDelivery

    Webhook.objects.create(
        tenant=Tenant.objects.get(slug="acme"), url="http://192.0.2.1/", cursor=0
    )
    array = submit(as_user("bob"), array="0-2").json()
    dispatch_once()
    tasks = sorted(placed(array["id"]), key=lambda j: j.array_index)
    for job in tasks:
        finish(job, exit_code=0 if job.array_index else 3)
    webhooks.deliveries_enqueue(now=timezone.now() + timedelta(seconds=webhooks.SETTLE_SECONDS + 1))
    payloads = [d.payload for d in WebhookDelivery.objects.order_by("event_id")]
    ended = [p for p in payloads if p["type"] == "array.ended"]
    assert len(ended) == 1, payloads
    assert ended[0]["array"]["id"] == array["id"] and ended[0]["array"]["size"] == 3
    assert ended[0]["counts"] == {"succeeded": 2, "failed": 1, "cancelled": 0}
    assert payloads[-1]["type"] == "array.ended"  # after every task's own end
    last = Job.objects.get(pk=JobEvent.objects.get(kind="array").job_id)
    streamed = "".join(state_events(last.pk, Cursor()))
    assert streamed.count("event: array.ended") == 1


def test_a_big_array_gets_its_tenants_share_and_another_tenant_of_the_tier_still_runs(cast):
    """Noisy neighbour, arrays: initech's 1,000-task array came first and fills the node; once
    its first tasks end, globex (same tier, pro), which submitted 4 jobs after it, gets GPUs:
    the array's tasks are that tenant's jobs in fair share, not a queue of their own."""
    from apps.tenants.services import tenant_create, user_create
    from tests.factories import client_for

    tenant_create(slug="initech", tier_name="pro")
    nora = client_for(user_create(username="nora", tenant_slug="initech")[1])
    quota_set(tenant=Tenant.objects.get(slug="initech"), max_queued_jobs=5000)
    pro = {**TRAIN, "tier": "pro"}
    array = nora.post("/api/v1/jobs/", {**pro, "array": "0-999"}, format="json")
    assert array.status_code == 201, array.content
    dispatch_once()
    first = placed(array.json()["id"])
    assert len(first) == 8  # the node's 8 GPUs, nothing else was queued
    theirs = [cast_post(cast, "dave", pro) for _ in range(4)]
    assert all(r.status_code == 201 for r in theirs), [r.content for r in theirs]
    for job in first:
        finish(job)
    dispatch_once()
    started = Job.objects.filter(pk__in=[r.json()["id"] for r in theirs], state="starting").count()
    assert started == 4, started  # globex is served although 992 older tasks of initech wait
    assert len(placed(array.json()["id"])) == 4


def cast_post(cast, name, body):
    from tests.factories import client_for

    return client_for(cast[name][1]).post("/api/v1/jobs/", body, format="json")


@pytest.mark.django_db(transaction=True)
def test_on_postgresql_an_array_is_its_row_alone_until_the_dispatchers_pass_makes_its_tasks():
    """As in production (no test transaction around the request), an array without a key or
    dependencies is written as its row alone (apps/admission/arrays.py `_admit_in_one_statement`):
    every task virtual, listed and counted as queued; the next pass makes the first rows, each with
    the id and the place in the queue (`created_at`) it was listed with: the array's submit."""
    if connection.vendor != "postgresql":
        pytest.skip("the one-statement admit is PostgreSQL's; SQLite's makes the first task's row")
    people = make_cast()
    make_node("h1", "H100-80GB", 8)
    quota_set(
        tenant=Tenant.objects.get(slug="acme"), submit_rate_per_minute=100_000, submit_burst=100_000
    )
    bob = client_for(people["bob"][1])
    assert submit(bob).status_code == 201  # the tenant's count row
    created = submit(bob, array="0-19%3", name="sweep")
    assert created.status_code == 201, created.content
    array = created.json()
    assert JobArray.objects.get(pk=array["id"]).materialised == 0
    assert not Job.objects.filter(array_id=array["id"]).exists()
    assert array["counts"]["queued"] == 20
    assert bob.get(f"/api/v1/arrays/{array['id']}/").json() == array
    listed = bob.get(array["tasks_url"] + "&page_size=100").json()["results"]
    assert [t["array_index"] for t in listed] == list(range(20))
    dispatch_once()
    rows = {str(j.pk): j for j in Job.objects.filter(array_id=array["id"])}
    assert rows and len(placed(array["id"])) == 3  # %3
    again = bob.get(array["tasks_url"] + "&page_size=100").json()["results"]
    assert [t["id"] for t in again] == [t["id"] for t in listed]
    assert [t["created_at"] for t in again] == [t["created_at"] for t in listed]
    first = rows[listed[0]["id"]]
    assert first.created_at == JobArray.objects.get(pk=array["id"]).created_at


def test_a_pass_with_no_array_open_reads_one_probe_for_them(as_user, django_assert_num_queries):
    from django.test.utils import CaptureQueriesContext

    from apps.admission.arrays import materialise

    with django_assert_num_queries(1):
        assert materialise() == 0
    array = submit(as_user("bob"), array="0-2").json()
    with CaptureQueriesContext(connection) as read:
        materialise()  # the probe finds it open: its tasks are counted and made as before
    assert len(read.captured_queries) > 1
    assert Job.objects.filter(array_id=array["id"]).count() == 3
