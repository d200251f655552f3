"""The dispatcher's start plan (apps/scheduling/plan.py) on the database: a queued job behind a
running job of known length gets an estimate from history inside its window, stored with it, that
does not move with the clock; its reason agrees; another tenant's reason names no job of ours;
`queue_position` is the plan's order."""

import json
import re
from datetime import datetime, timedelta

import pytest
from django.test import Client
from django.utils import timezone

from apps.admission import estimates
from apps.jobs.models import Job, JobAttempt
from apps.scheduling import plan
from apps.scheduling.core.calibrate import BUCKETS, MIN_SAMPLES
from apps.scheduling.dispatcher import dispatch_once
from tests.admission.conftest import TRAIN, cast, generous, run_to_end  # noqa: F401 (fixtures)
from tests.factories import client_for

EPOCH = re.compile(r"\b1\d{9}\b")


def ts(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


@pytest.fixture
def people(cast):  # noqa: F811
    plan.forget()
    estimates.forget()
    page = Client()
    page.force_login(cast["bob"][0])
    yield {**{name: client_for(cast[name][1]) for name in ("bob", "dave")}, "page": page}
    plan.forget()


def history(client, tmp_path, seconds):
    """Runs of bob's demo-train that lasted `seconds` each."""
    for length in seconds:
        job = client.post("/api/v1/jobs/", {**TRAIN, "gpus": 8}, format="json").json()
        dispatch_once()
        run_to_end(job["id"], tmp=tmp_path)
        end = timezone.now()
        JobAttempt.objects.filter(job_id=job["id"]).update(
            started_at=end - timedelta(seconds=length), ended_at=end
        )


def replan():
    plan.PLANNER.made_at = -1e9  # due now, whatever the clock
    dispatch_once()


def test_an_estimate_from_history_inside_its_window_that_the_clock_does_not_move(people, tmp_path):
    bob, dave = people["bob"], people["dave"]
    history(bob, tmp_path, [100, 110, 120, 130, 140])
    running = bob.post("/api/v1/jobs/", {**TRAIN, "gpus": 8, "max_runtime_seconds": 3600},
                       format="json").json()  # fmt: skip
    dispatch_once()
    attempt = JobAttempt.objects.get(job_id=running["id"])
    began = timezone.now() - timedelta(seconds=20)
    JobAttempt.objects.filter(pk=attempt.pk).update(started_at=began)
    mine = bob.post("/api/v1/jobs/", {**TRAIN, "gpus": 8}, format="json").json()
    theirs = dave.post("/api/v1/jobs/", {**TRAIN, "gpus": 8}, format="json").json()
    replan()
    job = bob.get(f"/api/v1/jobs/{mine['id']}/").json()
    start = ts(job["estimated_start_at"])
    earliest, latest = (ts(t) for t in job["estimated_start_window"])
    # Ends by history (100-140 s, median 120), not by its 3600 s limit.
    assert abs((start - began).total_seconds() - 120) < 5, (start, began)
    assert earliest <= start <= latest and (latest - began).total_seconds() <= 145
    assert job["queue_position"] == 1
    minute = start.strftime("%Y-%m-%dT%H:%M:%SZ")
    assert f"; expected to start {minute} (in ~" in job["reason"], job["reason"]
    html = people["page"].get(f"/jobs/{mine['id']}/").content.decode()
    shown = re.search(r'<p id="estimate"[^>]*>(.*?)</p>', html, re.S)
    assert shown and "in ~" in shown.group(1) and "likely" in shown.group(1), html
    stored = Job.objects.get(pk=mine["id"]).planned_at
    replan()  # later, nothing changed: the same estimate, not written again
    again = bob.get(f"/api/v1/jobs/{mine['id']}/").json()
    assert again["estimated_start_at"] == job["estimated_start_at"]
    assert Job.objects.get(pk=mine["id"]).planned_at == stored
    other = dave.get(f"/api/v1/jobs/{theirs['id']}/").json()
    assert other["queue_position"] == 2 and ts(other["estimated_start_at"]) > start
    assert running["id"] not in other["reason"] and mine["id"] not in other["reason"]
    assert not EPOCH.search(other["reason"]), other["reason"]


def test_without_history_a_job_is_planned_to_run_to_its_limit(people):
    bob = people["bob"]
    running = bob.post("/api/v1/jobs/", {**TRAIN, "gpus": 8, "max_runtime_seconds": 600},
                       format="json").json()  # fmt: skip
    dispatch_once()
    placed = JobAttempt.objects.get(job_id=running["id"]).created_at
    queued = bob.post("/api/v1/jobs/", {**TRAIN, "gpus": 8}, format="json").json()
    replan()
    job = bob.get(f"/api/v1/jobs/{queued['id']}/").json()
    start = ts(job["estimated_start_at"])
    assert abs((start - placed).total_seconds() - 600) < 5
    earliest, latest = (ts(t) for t in job["estimated_start_window"])
    assert earliest < start <= latest


def test_the_event_stream_sends_the_estimate_in_words_when_it_changes():
    from datetime import UTC
    from types import SimpleNamespace

    from apps.jobs.event_hub import Cursor, estimate_event

    now = datetime.now(UTC)
    job = {"state": "queued", "reason": "waiting; expected to start "
           f"{(now + timedelta(minutes=12)):%Y-%m-%dT%H:%M:%S}Z",
           "planned_start_at": now + timedelta(minutes=12),
           "planned_start_earliest": now + timedelta(minutes=8),
           "planned_start_latest": now + timedelta(minutes=20, seconds=30),
           "planned_position": 3, "planned_at": now}  # fmt: skip
    subscriber = SimpleNamespace(estimate=())
    [message] = list(estimate_event(subscriber, job, Cursor()))
    assert message.startswith("id: 0.1.0\nevent: estimate\n")
    data = json.loads(message.split("data: ", 1)[1])
    assert data["in"] == "in ~12 min, likely 8-20 min" and data["queue_position"] == 3
    assert "(in ~12 min)" in data["reason"] and len(data["estimated_start_window"]) == 2
    assert list(estimate_event(subscriber, job, Cursor())) == []  # unchanged: not sent again


def test_a_job_only_a_draining_node_could_run_waits_and_says_so(people):
    from apps.admission import fit
    from apps.nodes.models import Node, NodeState
    from tests.factories import make_node

    big = make_node("big", "H100-80GB", 16)
    Node.objects.filter(pk=big.pk).update(state=NodeState.DRAINING)
    fit.forget()
    job = people["bob"].post("/api/v1/jobs/", {**TRAIN, "gpus": 16}, format="json")
    assert job.status_code == 201, job.content
    replan()
    shown = people["bob"].get(f"/api/v1/jobs/{job.json()['id']}/").json()
    assert shown["state"] == "queued" and shown["estimated_start_at"] is None
    assert shown["reason"].startswith("only a draining node could run it"), shown["reason"]


def test_a_calibrated_plan_scales_its_wait_by_the_past_errors_and_then_stands(people):
    bob = people["bob"]
    running = bob.post("/api/v1/jobs/", {**TRAIN, "gpus": 8, "max_runtime_seconds": 600},
                       format="json").json()  # fmt: skip
    dispatch_once()
    placed = JobAttempt.objects.get(job_id=running["id"]).created_at
    # Earlier plans were all twice too early (whatever the tier or the planned wait).
    calibrator = plan.PLANNER.calibrator
    for b in range(BUCKETS):
        for i in range(MIN_SAMPLES):
            planned_wait = 60.0 * 4**b + 1
            calibrator.planned(f"x{b}-{i}", "other", 0.0, planned_wait)
            calibrator.started(f"x{b}-{i}", 2 * planned_wait)
    queued = bob.post("/api/v1/jobs/", {**TRAIN, "gpus": 8}, format="json").json()
    replan()
    job = bob.get(f"/api/v1/jobs/{queued['id']}/").json()
    at = Job.objects.get(pk=queued["id"]).planned_at
    raw = (placed + timedelta(seconds=600) - at).total_seconds()  # the plan: at the limit
    start = ts(job["estimated_start_at"])
    assert abs((start - at).total_seconds() - 2 * raw) < 5, (start, at, raw)
    assert [ts(t) for t in job["estimated_start_window"]] == [start, start]
    assert f"; expected to start {start:%Y-%m-%dT%H:%M:%S}Z (in ~" in job["reason"]
    assert queued["id"].replace("-", "") in calibrator.open_jobs()
    replan()  # later: the first calibrated estimate stands
    assert (
        bob.get(f"/api/v1/jobs/{queued['id']}/").json()["estimated_start_at"]
        == job["estimated_start_at"]
    )


def test_the_middle_run_takes_the_mean_of_a_heavy_tailed_history():
    # Four short runs and one long: the queue ahead drains at their mean (168 s), not at the
    # median (60 s); the early and late runs keep their quantiles.
    predictor = plan.Predictor.of_runs({(1, 7): [60.0, 60.0, 60.0, 60.0, 600.0]})
    assert predictor.runtime(0.5, 1, 7, 3600.0) == 168.0
    assert predictor.runtime(0.1, 1, 7, 3600.0) == 60.0
    assert predictor.runtime(0.5, 1, 7, 100.0) == 100.0  # within its limit
    # Running 30 s: every run was longer, so the mean of them is what is left, less 30 s.
    assert predictor.remaining(0.5, 1, 7, 3600.0, 30.0) == 138.0
