"""Dependencies with job arrays (apps/jobs/dependencies.py, docs/pipelines.md): a job after a
whole array (afterok fails at the first failed task, afterany waits for every task, afternotok
holds at the first failure), an array after a job (held: no task rows; failed whole, the tasks
without a row too), aftercorr task by task with lazily made tasks, and the 400s and 404s."""

import threading
import time
import uuid

import pytest
from django.db import connection, connections, transaction

from apps.jobs import dependencies
from apps.jobs.arrays import counts, task_id
from apps.jobs.models import Job, JobArray
from apps.jobs.services import job_cancel, job_requeue
from apps.scheduling.dispatcher import dispatch_once
from tests.admission.test_arrays import finish

JOB = {"command": ["true"], "gpus": 1, "gpu_sku": "H100-80GB"}


@pytest.fixture
def bob(as_user):
    return as_user("bob")


def post(client, **extra):
    response = client.post("/api/v1/jobs/", {**JOB, **extra}, format="json")
    assert response.status_code == 201, response.json()
    return response.json()


def run_all(array_id, exit_codes: dict | None = None, *, passes: int = 10) -> None:
    """Dispatch and finish what is placed (the array's tasks with their exit code by index,
    default 0; any other job placed meanwhile with 0) until the array has ended."""
    for _ in range(passes):
        if JobArray.objects.get(pk=array_id).ended_at is not None:
            return
        dispatch_once()
        for job in Job.objects.filter(state="starting"):
            mine = str(job.array_id) == str(array_id)
            finish(job, (exit_codes or {}).get(job.array_index, 0) if mine else 0)


def released(job_id) -> bool:
    """Released by its dependencies: queued for the dispatcher (or placed by it since)."""
    row = Job.objects.get(pk=job_id)
    return not row.held_by_dependencies and row.state in ("queued", "starting")


def state(job_id) -> tuple[str, str]:
    row = Job.objects.get(pk=job_id)
    return row.state, row.reason


# --- a job after an array -------------------------------------------------------------------------


def test_a_job_afterok_an_array_starts_when_every_task_succeeded(bob):
    array = post(bob, array="0-3")
    child = post(bob, depends_on=[{"array": array["id"], "condition": "afterok"}])
    assert child["reason"] == f"waiting for dependency array {array['id']} (afterok)"
    assert child["depends_on"] == [
        {"array": array["id"], "condition": "afterok", "state": "pending"}
    ]
    run_all(array["id"])
    assert counts(JobArray.objects.get(pk=array["id"]))["succeeded"] == 4
    assert released(child["id"])


def test_a_job_afterok_an_array_fails_at_the_first_failed_task(bob):
    array = post(bob, array="0-3%1")  # one at a time: three tasks are still to run
    child = post(bob, depends_on=[{"array": array["id"], "condition": "afterok"}])
    notok = post(bob, depends_on=[{"array": array["id"], "condition": "afternotok"}])
    anyend = post(bob, depends_on=[{"array": array["id"], "condition": "afterany"}])
    dispatch_once()
    first = Job.objects.get(array_id=array["id"], state="starting")
    finish(first, 1)
    row = Job.objects.get(pk=child["id"])
    assert row.state == "failed"
    assert (
        row.reason
        == f"dependency array {array['id']} failed (1 of 4 tasks did not succeed) (afterok)"
    )
    assert state(notok["id"]) == ("queued", dependencies.RELEASED)  # holds at the first failure
    assert (
        state(anyend["id"])[0] == "queued" and Job.objects.get(pk=anyend["id"]).held_by_dependencies
    )
    run_all(array["id"])
    assert released(anyend["id"])  # every task ended


def test_afternotok_an_array_that_all_succeeded_fails(bob):
    array = post(bob, array="0-1")
    child = post(bob, depends_on=[{"array": array["id"], "condition": "afternotok"}])
    run_all(array["id"])
    assert state(child["id"])[0] == "failed"


def test_a_cancelled_array_decides_its_dependents_its_virtual_tasks_too(bob):
    array = post(bob, array="0-99")
    ok = post(bob, depends_on=[{"array": array["id"], "condition": "afterok"}])
    anyend = post(bob, depends_on=[{"array": array["id"], "condition": "afterany"}])
    assert bob.post(f"/api/v1/arrays/{array['id']}/cancel/").status_code == 200
    assert state(ok["id"])[0] == "failed"
    assert state(anyend["id"]) == ("queued", dependencies.RELEASED)


# --- an array after a job ------------------------------------------------------------------------


def test_an_array_after_a_job_is_held_whole_then_released(bob):
    parent = post(bob)
    array = post(bob, array="0-9", depends_on=[{"job": parent["id"], "condition": "afterok"}])
    row = JobArray.objects.get(pk=array["id"])
    assert row.held_by_dependencies and row.materialised == 1  # its first task, held
    first = Job.objects.get(array_id=array["id"])
    assert (
        first.held_by_dependencies
        and first.reason == f"waiting for dependency {parent['id']} (afterok)"
    )
    placed = dispatch_once().placed
    assert parent["id"] in placed and str(first.pk) not in placed
    assert JobArray.objects.get(pk=array["id"]).materialised == 1  # a held array makes no rows
    listed = bob.get(f"/api/v1/jobs/?array={array['id']}").json()["results"]
    assert {t["reason"] for t in listed[1:]} == {f"waiting for dependency {parent['id']} (afterok)"}
    assert listed[1]["depends_on"] == [
        {"job": parent["id"], "condition": "afterok", "state": "pending"}
    ]
    finish(Job.objects.get(pk=parent["id"]), 0)
    assert not JobArray.objects.get(pk=array["id"]).held_by_dependencies
    assert state(first.pk) == ("queued", dependencies.RELEASED)
    run_all(array["id"])
    assert counts(JobArray.objects.get(pk=array["id"]))["succeeded"] == 10


def test_an_array_whose_dependency_fails_fails_whole_and_its_dependents_follow(bob):
    parent = post(bob)
    array = post(bob, array="0-499", depends_on=[{"job": parent["id"], "condition": "afterok"}])
    after_array = post(bob, depends_on=[{"array": array["id"], "condition": "afterany"}])
    ok_after_array = post(bob, depends_on=[{"array": array["id"], "condition": "afterok"}])
    dispatch_once()
    finish(Job.objects.get(pk=parent["id"]), 3)
    row = JobArray.objects.get(pk=array["id"])
    assert row.failed_reason == f"dependency {parent['id']} failed (afterok)"
    assert row.ended_at is not None  # the tasks without a row have failed with it
    assert counts(row)["failed"] == 500 and row.materialised == 1  # no row made for them
    virtual = bob.get(f"/api/v1/jobs/?array={array['id']}").json()["results"][5]
    assert (virtual["state"], virtual["reason"]) == ("failed", row.failed_reason)
    assert state(after_array["id"]) == ("queued", dependencies.RELEASED)  # every task ended
    assert state(ok_after_array["id"])[0] == "failed"


def test_an_array_after_a_job_that_failed_already_fails_at_submit(bob):
    parent = post(bob)
    job_cancel(job=Job.objects.get(pk=parent["id"]), actor="user:bob")
    array = post(bob, array="0-3", depends_on=[{"job": parent["id"]}])
    row = JobArray.objects.get(pk=array["id"])
    assert row.ended_at is not None and counts(row)["failed"] == 4


# --- a parent array's failed tasks requeued ------------------------------------------------------


def test_requeue_failed_holds_the_dependents_not_started_again_and_leaves_the_failed(bob):
    array = post(bob, array="0-1")
    ok = post(bob, depends_on=[{"array": array["id"], "condition": "afterok"}])
    notok = post(bob, depends_on=[{"array": array["id"], "condition": "afternotok"}])
    anyend = post(bob, depends_on=[{"array": array["id"], "condition": "afterany"}])
    dispatch_once()
    for task in Job.objects.filter(array_id=array["id"]):
        finish(task, 1 if task.array_index == 1 else 0)
    assert JobArray.objects.get(pk=array["id"]).ended_at is not None
    assert state(ok["id"])[0] == "failed"
    assert released(notok["id"]) and released(anyend["id"])
    assert bob.post(f"/api/v1/arrays/{array['id']}/requeue-failed/").status_code == 200
    assert JobArray.objects.get(pk=array["id"]).ended_at is None  # its end is to come again
    assert state(ok["id"])[0] == "failed"  # what failed on the first end stays failed
    for waiting, condition in ((notok, "afternotok"), (anyend, "afterany")):
        row = Job.objects.get(pk=waiting["id"])
        assert row.held_by_dependencies, condition
        assert row.reason == f"waiting for dependency array {array['id']} ({condition})"
    run_all(array["id"])  # task 1 succeeds this time
    assert state(notok["id"])[0] == "failed" and released(anyend["id"])


def test_a_requeued_parent_job_holds_a_released_array_whole_again(bob):
    parent = post(bob)
    array = post(bob, array="0-9", depends_on=[{"job": parent["id"], "condition": "afterok"}])
    dispatch_once()
    finish(Job.objects.get(pk=parent["id"]), 0)
    first = Job.objects.get(array_id=array["id"])
    assert state(first.pk) == ("queued", dependencies.RELEASED)
    job_requeue(job=Job.objects.get(pk=parent["id"]), actor="staff:support", reason="requeued")
    assert JobArray.objects.get(pk=array["id"]).held_by_dependencies
    assert state(first.pk) == ("queued", f"waiting for dependency {parent['id']} (afterok)")
    placed = dispatch_once().placed
    assert placed == [parent["id"]] and JobArray.objects.get(pk=array["id"]).materialised == 1
    finish(Job.objects.get(pk=parent["id"]), 1)  # this time it fails: the array fails whole
    assert JobArray.objects.get(pk=array["id"]).failed_reason == (
        f"dependency {parent['id']} failed (afterok)"
    )


def test_a_requeued_parent_task_holds_its_aftercorr_task_again(bob):
    parent = post(bob, array="0-1")
    child = post(bob, array="0-1", depends_on=[{"array": parent["id"], "condition": "aftercorr"}])
    dispatch_once()
    for task in Job.objects.filter(array_id=parent["id"]):
        finish(task, 0)
    task_0 = Job.objects.get(pk=task_id(child["id"], 0))
    assert (task_0.state, task_0.held_by_dependencies) == ("queued", False)
    requeued = Job.objects.get(pk=task_id(parent["id"], 0))
    job_requeue(job=requeued, actor="staff:support", reason="requeued")
    task_0.refresh_from_db()
    assert task_0.held_by_dependencies
    assert task_0.reason == f"waiting for dependency {requeued.pk} (aftercorr)"


# --- aftercorr ------------------------------------------------------------------------------------


def test_aftercorr_runs_task_i_after_task_i_with_lazy_tasks(bob):
    pre = post(bob, array="0-5%2")  # two at a time: the later tasks become rows late
    train = post(bob, array="0-5", depends_on=[{"array": pre["id"], "condition": "aftercorr"}])
    first_train = Job.objects.get(pk=task_id(train["id"], 0))
    assert first_train.held_by_dependencies
    assert first_train.reason == f"waiting for dependency {task_id(pre['id'], 0)} (aftercorr)"
    dispatch_once()
    assert not Job.objects.filter(array_id=train["id"]).exclude(held_by_dependencies=True).exists()
    finish(Job.objects.get(pk=task_id(pre["id"], 0)), 0)
    finish(Job.objects.get(pk=task_id(pre["id"], 1)), 2)  # task 1 of train can never run
    assert state(task_id(train["id"], 0)) == ("queued", dependencies.RELEASED)
    assert state(task_id(train["id"], 1)) == (
        "failed", f"dependency {task_id(pre['id'], 1)} failed (aftercorr)"
    )  # fmt: skip
    shown = bob.get(f"/api/v1/jobs/{task_id(train['id'], 0)}/").json()["depends_on"]
    assert shown == [{"array": pre["id"], "condition": "aftercorr", "state": "satisfied"}]
    run_all(pre["id"], {3: 1})
    run_all(train["id"])
    by_index = dict(Job.objects.filter(array_id=train["id"]).values_list("array_index", "state"))
    assert by_index == {0: "succeeded", 1: "failed", 2: "succeeded", 3: "failed", 4: "succeeded",
                        5: "succeeded"}  # fmt: skip


def test_aftercorr_shapes(bob):
    pre = post(bob, array="0-3")
    answer = bob.post("/api/v1/jobs/", {**JOB, "depends_on": [{"array": pre["id"], "condition": "aftercorr"}]},
                      format="json")  # fmt: skip
    assert answer.status_code == 400 and list(answer.json()) == ["depends_on"]  # not an array
    answer = bob.post("/api/v1/jobs/", {**JOB, "array": "0-4", "depends_on": [{"array": pre["id"],
                      "condition": "aftercorr"}]}, format="json")  # fmt: skip
    assert answer.status_code == 400 and "no task 4" in answer.json()["depends_on"][0]
    answer = bob.post("/api/v1/jobs/", {**JOB, "array": "0-3", "depends_on": [{"array": str(uuid.uuid4()),
                      "condition": "afterok"}]}, format="json")  # fmt: skip
    assert answer.status_code == 404 and list(answer.json()) == ["depends_on"]
    assert JobArray.objects.count() == 1  # nothing written by the refusals


def test_another_tenants_array_is_404(bob, as_user):
    theirs = as_user("dave").post(
        "/api/v1/jobs/", {"template": "demo-train", "params": {"steps": 1}, "gpus": 1, "array": "0-1"},
        format="json",
    )  # fmt: skip
    assert theirs.status_code == 201, theirs.json()
    answer = bob.post(
        "/api/v1/jobs/", {**JOB, "depends_on": [{"array": theirs.json()["id"]}]}, format="json"
    )
    assert answer.status_code == 404 and list(answer.json()) == ["depends_on"]


def test_aftercorr_tasks_made_after_their_parent_task_ended_are_decided_as_they_are_made(
    bob, settings, monkeypatch
):
    settings.ARRAY_QUEUED_TASKS = 1
    pre = post(bob, array="0-19%2")
    train = post(
        bob, array="0-19", gpus=4, depends_on=[{"array": pre["id"], "condition": "aftercorr"}]
    )
    made_after, tasks_made = [], dependencies.tasks_made

    def spy(array, jobs):
        parents = [task_id(pre["id"], j.array_index) for j in jobs]
        ended = Job.objects.filter(pk__in=parents, state__in=["succeeded", "failed"])
        made_after.extend(ended.values_list("array_index", flat=True))
        tasks_made(array, jobs)

    monkeypatch.setattr(dependencies, "tasks_made", spy)
    run_all(pre["id"], {17: 1}, passes=100)
    assert counts(JobArray.objects.get(pk=pre["id"]))["succeeded"] == 19
    run_all(train["id"], passes=100)
    assert made_after  # some train tasks became rows after their parent task had ended
    by_index = dict(Job.objects.filter(array_id=train["id"]).values_list("array_index", "state"))
    assert len(by_index) == 20 and by_index.pop(17) == "failed"
    assert set(by_index.values()) == {"succeeded"}
    assert Job.objects.get(pk=task_id(train["id"], 17)).reason == (
        f"dependency {task_id(pre['id'], 17)} failed (aftercorr)"
    )


@pytest.mark.django_db(transaction=True)
def test_an_aftercorr_task_whose_two_parents_end_at_once_in_two_transactions_is_released(bob):
    """Task 0 of `train` waits for task 0 of `pre` (aftercorr) and for `gate` (afterok on the
    whole array). Both end at once in two transactions: each read the other's condition as
    pending, and task 0 stayed held for ever. The dependent array is now locked before either
    reads its conditions."""
    if connection.vendor != "postgresql":
        pytest.skip("SQLite runs one write transaction at a time: no interleaving to test")
    pre, gate = post(bob, array="0-0"), post(bob)
    train = post(bob, array="0-0", depends_on=[{"array": pre["id"], "condition": "aftercorr"},
                                               {"job": gate["id"], "condition": "afterok"}])  # fmt: skip
    dispatch_once()
    pre_0, gate_job = Job.objects.get(pk=task_id(pre["id"], 0)), Job.objects.get(pk=gate["id"])
    assert {pre_0.state, gate_job.state} == {"starting"}
    gate_decided = threading.Event()

    def end_pre_0() -> None:
        gate_decided.wait(5)
        try:
            finish(pre_0, 0)
        finally:
            connections.close_all()  # this thread's connection, so the test database can go

    other = threading.Thread(target=end_pre_0)
    other.start()
    with transaction.atomic():
        finish(gate_job, 0)
        gate_decided.set()
        time.sleep(0.5)  # pre's task 0 ends meanwhile, as far as it can before this commits
    other.join(10)
    assert not other.is_alive()
    assert state(task_id(train["id"], 0)) == ("queued", dependencies.RELEASED)
