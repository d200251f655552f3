"""Job dependencies (apps/jobs/dependencies.py, docs/pipelines.md): each condition, a failed
parent failing its dependents at once and transitively, all conditions must hold, another
tenant's job is 404, bad shapes are 400 naming `depends_on`, a held job is never placed nor
counted in the start estimate, the queue positions or the autoscaler's demand, and its
release asks for a dispatch pass."""

import threading
import time
import uuid

import pytest
from django.db import connection, connections, transaction

from apps.admission import estimates
from apps.jobs import dependencies
from apps.jobs.models import Job, JobAttempt, JobDependency
from apps.jobs.services import (
    attempt_member_finished,
    attempt_member_started,
    job_cancel,
    job_requeue,
)
from apps.scheduling.autoscaling import demand
from apps.scheduling.dispatcher import ordered_queue, queue_position
from tests.admission.conftest import placed_ids, run_to_end

JOB = {"command": ["true"], "gpus": 1, "gpu_sku": "H100-80GB"}


@pytest.fixture
def bob(as_user):
    return as_user("bob")


@pytest.fixture(autouse=True)
def fresh_estimates():
    estimates.forget()
    yield
    estimates.forget()


def submit(client, **extra):
    response = client.post("/api/v1/jobs/", {**JOB, **extra}, format="json")
    assert response.status_code == 201, response.json()
    return response.json()


def after(parent, condition="afterok"):
    return {
        "job": parent["id"] if isinstance(parent, dict) else str(parent),
        "condition": condition,
    }


def state(job) -> tuple[str, str]:
    row = Job.objects.get(pk=job["id"])
    return row.state, row.reason


def end(job, exit_code, tmp_path):
    assert job["id"] in placed_ids() or Job.objects.get(pk=job["id"]).state != "queued"
    return run_to_end(job["id"], exit_code=exit_code, tmp=tmp_path)


# --- the conditions --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("condition", "exit_code", "released"),
    [
        ("afterok", 0, True),
        ("afterok", 1, False),
        ("afterany", 0, True),
        ("afterany", 1, True),
        ("afternotok", 1, True),
        ("afternotok", 0, False),
    ],
)
def test_each_condition_on_a_parent_that_ends(bob, tmp_path, condition, exit_code, released):
    parent = submit(bob)
    child = submit(bob, depends_on=[after(parent, condition)])
    assert child["state"] == "queued"
    assert child["reason"] == f"waiting for dependency {parent['id']} ({condition})"
    assert child["depends_on"] == [
        {"job": parent["id"], "condition": condition, "state": "pending"}
    ]
    assert child["queue_position"] is None and child["estimated_start_at"] is None
    end(parent, exit_code, tmp_path)
    row = Job.objects.get(pk=child["id"])
    if released:
        assert (row.state, row.held_by_dependencies) == ("queued", False)
        assert row.reason == dependencies.RELEASED
        assert child["id"] in placed_ids()
    else:
        ended = "succeeded" if exit_code == 0 else "failed"
        assert (row.state, row.reason) == (
            "failed",
            f"dependency {parent['id']} {ended} ({condition})",
        )
        assert row.finished_at is not None
    shown = bob.get(f"/api/v1/jobs/{child['id']}/").json()["depends_on"]
    assert shown == [{"job": parent["id"], "condition": condition,
                      "state": "satisfied" if released else "never"}]  # fmt: skip


def test_afternotok_counts_a_cancelled_parent_and_afterok_fails_on_it(bob, cast):
    parent = submit(bob)
    notok = submit(bob, depends_on=[after(parent, "afternotok")])
    ok = submit(bob, depends_on=[after(parent, "afterok")])
    job_cancel(job=Job.objects.get(pk=parent["id"]), actor="user:bob")
    assert state(notok) == ("queued", dependencies.RELEASED)
    assert state(ok) == ("failed", f"dependency {parent['id']} cancelled (afterok)")


def test_condition_defaults_to_afterok(bob):
    parent = submit(bob)
    child = submit(bob, depends_on=[{"job": parent["id"]}])
    assert child["depends_on"][0]["condition"] == "afterok"


# --- failing at once, transitively ---------------------------------------------------------------


def test_a_failed_parent_fails_a_chain_of_three_at_once(bob, tmp_path):
    first = submit(bob)
    second = submit(bob, depends_on=[after(first)])
    third = submit(bob, depends_on=[after(second)])
    fourth = submit(bob, depends_on=[after(third, "afterany")])  # any end of the third will do
    end(first, 1, tmp_path)
    assert state(second) == ("failed", f"dependency {first['id']} failed (afterok)")
    assert state(third) == ("failed", f"dependency {second['id']} failed (afterok)")
    assert state(fourth) == ("queued", dependencies.RELEASED)  # afterany: the third ended


def test_a_long_chain_fails_in_one_go_without_recursion(bob, tmp_path):
    jobs = [submit(bob)]
    for _ in range(60):
        jobs.append(submit(bob, depends_on=[after(jobs[-1])]))
    end(jobs[0], 1, tmp_path)
    assert set(Job.objects.filter(pk__in=[j["id"] for j in jobs[1:]]).values_list("state", flat=True)) == {
        "failed"
    }  # fmt: skip


def test_many_dependents_of_one_parent_are_released_together(bob, tmp_path, monkeypatch):
    calls = []
    monkeypatch.setattr(dependencies, "trigger_dispatch", lambda: calls.append(1))
    parent = submit(bob)
    children = [submit(bob, depends_on=[after(parent)]) for _ in range(20)]
    assert not calls
    end(parent, 0, tmp_path)
    assert {state(c)[0] for c in children} == {"queued"}
    assert not Job.objects.filter(
        pk__in=[c["id"] for c in children], held_by_dependencies=True
    ).exists()
    assert calls == [1]  # one dispatch request for all twenty


# --- all must hold -----------------------------------------------------------------------------


def test_all_conditions_must_hold(bob, tmp_path, monkeypatch):
    a, b = submit(bob), submit(bob)
    child = submit(bob, depends_on=[after(a), after(b, "afterany")])
    assert child["reason"] == f"waiting for dependency {a['id']} (afterok)"
    calls = []
    monkeypatch.setattr(dependencies, "trigger_dispatch", lambda: calls.append(1))
    end(a, 0, tmp_path)
    assert state(child) == ("queued", f"waiting for dependency {b['id']} (afterany)")
    assert Job.objects.get(pk=child["id"]).held_by_dependencies
    assert child["id"] not in placed_ids() and not calls
    end(b, 1, tmp_path)
    assert state(child) == ("queued", dependencies.RELEASED)
    assert calls == [1]
    assert child["id"] in placed_ids()


def test_one_condition_that_cannot_hold_fails_the_job_whatever_the_others(bob, tmp_path):
    a, b = submit(bob), submit(bob)
    child = submit(bob, depends_on=[after(a), after(b)])
    end(b, 1, tmp_path)  # the second fails first: no need to wait for the first
    assert state(child) == ("failed", f"dependency {b['id']} failed (afterok)")


# --- parents that ended before the submit ------------------------------------------------------


def test_a_parent_that_ended_already_is_decided_at_submit(bob, tmp_path, monkeypatch):
    ok, bad = submit(bob), submit(bob)
    end(ok, 0, tmp_path)
    end(bad, 1, tmp_path)
    calls = []
    monkeypatch.setattr(dependencies, "trigger_dispatch", lambda: calls.append(1))
    ready = submit(bob, depends_on=[after(ok)])
    assert (ready["state"], ready["reason"]) == ("queued", dependencies.RELEASED)
    assert ready["depends_on"][0]["state"] == "satisfied" and calls == [1]
    assert ready["queue_position"] == 1
    doomed = submit(bob, depends_on=[after(ok), after(bad)])
    assert (doomed["state"], doomed["reason"]) == (
        "failed",
        f"dependency {bad['id']} failed (afterok)",
    )
    assert [d["state"] for d in doomed["depends_on"]] == ["satisfied", "never"]


def test_a_job_depending_on_an_already_failed_one_fails_transitively_at_submit(bob, tmp_path):
    bad = submit(bob)
    end(bad, 1, tmp_path)
    middle = submit(bob)  # still queued
    child = submit(bob, depends_on=[after(middle)])
    grandchild = submit(bob, depends_on=[after(child)])
    job_cancel(job=Job.objects.get(pk=middle["id"]), actor="user:bob")
    assert state(child)[0] == "failed" and state(grandchild)[0] == "failed"


# --- a parent requeued after its end (Slurm: its dependents not started wait again) ---------------


def requeue(job) -> None:
    job_requeue(job=Job.objects.get(pk=job["id"]), actor="staff:support", reason="requeued")


def test_a_requeued_parent_holds_its_released_dependents_again(bob, tmp_path):
    parent = submit(bob)
    child = submit(bob, depends_on=[after(parent)])
    end(parent, 0, tmp_path)
    assert state(child) == ("queued", dependencies.RELEASED)  # not placed yet
    requeue(parent)
    row = Job.objects.get(pk=child["id"])
    assert row.held_by_dependencies
    assert row.reason == f"waiting for dependency {parent['id']} (afterok)"
    assert bob.get(f"/api/v1/jobs/{child['id']}/").json()["depends_on"] == [
        {"job": parent["id"], "condition": "afterok", "state": "pending"}
    ]
    assert placed_ids() == {parent["id"]}  # the dependent waits for the parent's new end
    run_to_end(parent["id"], exit_code=1, tmp=tmp_path)
    assert state(child) == ("failed", f"dependency {parent['id']} failed (afterok)")


def test_a_requeued_parent_leaves_a_failed_or_placed_dependent_as_it_is(bob, tmp_path):
    parent = submit(bob)
    failed = submit(bob, depends_on=[after(parent, "afternotok")])
    placed = submit(bob, depends_on=[after(parent, "afterany")])
    end(parent, 0, tmp_path)
    assert state(failed)[0] == "failed"
    assert placed_ids() == {placed["id"]}
    waiting = submit(bob, depends_on=[after(parent, "afterany")])  # released at its submit
    requeue(parent)
    assert state(failed) == ("failed", f"dependency {parent['id']} succeeded (afternotok)")
    assert Job.objects.get(pk=placed["id"]).state == "starting"
    assert JobDependency.objects.get(job_id=failed["id"]).state == "never"
    assert JobDependency.objects.get(job_id=placed["id"]).state == "satisfied"
    assert JobDependency.objects.get(job_id=waiting["id"]).state == "pending"
    assert Job.objects.get(pk=waiting["id"]).held_by_dependencies


def test_a_dispatcher_pass_that_read_a_dependent_before_it_was_held_again_cannot_place_it(
    bob, tmp_path
):
    parent = submit(bob)
    child = submit(bob, depends_on=[after(parent)])
    end(parent, 0, tmp_path)
    read_before = Job.objects.get(pk=child["id"])
    requeue(parent)
    assert Job.objects.get(pk=child["id"]).version == read_before.version + 1  # its CAS fails


# --- who may depend on what ----------------------------------------------------------------------


def test_another_tenants_job_or_an_unknown_one_is_404(bob, as_user):
    dave = as_user("dave")  # globex may not run commands: a template
    response = dave.post("/api/v1/jobs/", {"template": "demo-train", "params": {"steps": 1}, "gpus": 1},
                         format="json")  # fmt: skip
    assert response.status_code == 201, response.json()
    theirs = response.json()
    before = Job.objects.count()
    for parent in (theirs["id"], str(uuid.uuid4())):
        answer = bob.post("/api/v1/jobs/", {**JOB, "depends_on": [after(parent)]}, format="json")
        assert answer.status_code == 404, answer.json()
        assert list(answer.json()) == ["depends_on"]
    assert Job.objects.count() == before  # nothing written


@pytest.mark.parametrize(
    "depends_on",
    [
        {"job": "x"},  # not a list
        "afterok:123",
        [{"job": "not-a-uuid", "condition": "afterok"}],
        [{"job": str(uuid.uuid4()), "condition": "afterwards"}],
        [{"job": str(uuid.uuid4()), "condition": "aftercorr"}],  # aftercorr is for arrays
        [{"condition": "afterok"}],
        [{"job": str(uuid.uuid4()), "array": str(uuid.uuid4())}],
        [{"job": str(uuid.uuid4()), "colour": "blue"}],
        [{"job": 12}],
        ["123"],
        [{"job": str(uuid.uuid4())}] * (dependencies.MAX_DEPENDENCIES + 1),
    ],
)
def test_bad_shapes_are_400_naming_depends_on(bob, depends_on):
    answer = bob.post("/api/v1/jobs/", {**JOB, "depends_on": depends_on}, format="json")
    assert answer.status_code == 400, answer.json()
    assert list(answer.json()) == ["depends_on"]


# --- held jobs wait for no GPU ----------------------------------------------------------------


def test_held_jobs_are_not_placed_nor_counted(bob, cast):
    from tests.factories import make_node

    parent = submit(bob, gpus=8)  # takes the whole node h1
    assert parent["id"] in placed_ids()
    held = [submit(bob, depends_on=[after(parent)]) for _ in range(3)]
    plain = submit(bob)
    assert all(h["queue_position"] is None and h["estimated_start_at"] is None for h in held)
    assert plain["queue_position"] == 1  # the held jobs before it take no place
    held_ids = {h["id"] for h in held}
    assert not held_ids & {str(j.pk) for j in ordered_queue()}
    assert queue_position(Job.objects.get(pk=plain["id"])) == 1
    assert all(queue_position(Job.objects.get(pk=h["id"])) is None for h in held)
    listed = {j["id"]: j for j in bob.get("/api/v1/jobs/").json()["results"]}
    assert [listed[h]["queue_position"] for h in held_ids] == [None, None, None]
    assert listed[plain["id"]]["queue_position"] == 1
    # The start estimate: the plain job waits for the parent only, not for the held ones ahead.
    estimator = estimates.Estimator.load()
    assert all(estimator.estimate(Job.objects.get(pk=h)) is None for h in held_ids)
    assert estimator.estimate(Job.objects.get(pk=plain["id"])) is not None
    # The autoscaler's demand: the plain job's GPU only.
    from apps.nodes.models import GpuSku
    from apps.scheduling.models import AutoscalePolicy

    policy = AutoscalePolicy(sku=GpuSku.objects.get(name="H100-80GB"))
    assert [d.gpus for d in demand(policy)] == [1]
    # A second node with room: the plain job is placed, the held ones are not.
    make_node("h2", "H100-80GB", 8)
    placed = placed_ids()
    assert plain["id"] in placed and not held_ids & placed
    assert {Job.objects.get(pk=h).state for h in held_ids} == {"queued"}


def test_a_held_job_can_be_cancelled_and_its_dependents_follow(bob):
    parent = submit(bob)
    child = submit(bob, depends_on=[after(parent)])
    grandchild = submit(bob, depends_on=[after(child)])
    job_cancel(job=Job.objects.get(pk=child["id"]), actor="user:bob")
    assert state(grandchild) == ("failed", f"dependency {child['id']} cancelled (afterok)")
    assert state(parent)[0] == "queued"


def test_a_job_with_dependencies_is_never_served_from_the_result_cache(bob, tmp_path):
    infer = {"template": "demo-infer", "params": {"prompt": "hi", "max_tokens": 4, "seed": 1}, "gpus": 1,
             "gpu_sku": "H100-80GB"}  # fmt: skip
    first = bob.post("/api/v1/jobs/", infer, format="json").json()
    run_to_end(first["id"], tmp=tmp_path) if first["id"] in placed_ids() else None
    parent = submit(bob)
    again = bob.post(
        "/api/v1/jobs/", {**infer, "depends_on": [after(parent)]}, format="json"
    ).json()
    assert not again["cache_hit"] and again["state"] == "queued"
    assert JobDependency.objects.filter(job_id=again["id"]).count() == 1


@pytest.mark.django_db(transaction=True)
def test_a_job_after_two_parents_that_end_at_once_in_two_transactions_is_released(
    as_user, tmp_path
):
    """Each parent's end decided its own condition and read the other's as still pending (the
    other transaction had not committed), so neither released the job: it waited for ever.
    Here parent a's end holds its transaction open while b's end runs in another thread."""
    if connection.vendor != "postgresql":
        pytest.skip("SQLite runs one write transaction at a time: no interleaving to test")
    bob = as_user("bob")
    a, b = submit(bob), submit(bob)
    child = submit(bob, depends_on=[after(a), after(b)])
    assert {a["id"], b["id"]} <= placed_ids()
    attempts = {j["id"]: JobAttempt.objects.get(job_id=j["id"]) for j in (a, b)}
    for attempt in attempts.values():
        attempt_member_started(attempt_id=attempt.pk, rank=0, token=str(attempt.token), pid=1)

    def finish(job) -> None:
        attempt = attempts[job["id"]]
        attempt_member_finished(
            attempt_id=attempt.pk, rank=0, token=str(attempt.token), exit_code=0
        )

    a_decided = threading.Event()

    def end_b() -> None:
        a_decided.wait(5)
        try:
            finish(b)
        finally:
            connections.close_all()  # this thread's connection, so the test database can go

    other = threading.Thread(target=end_b)
    other.start()
    with transaction.atomic():
        finish(a)
        a_decided.set()
        time.sleep(0.5)  # b's end runs meanwhile, as far as it can before a's commit
    other.join(10)
    assert not other.is_alive()
    assert state(child) == ("queued", dependencies.RELEASED)
    assert not Job.objects.get(pk=child["id"]).held_by_dependencies
