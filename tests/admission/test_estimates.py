"""Where am I: `estimated_start_at` from the queue ahead, capacity and running jobs' ends."""

from datetime import datetime, timedelta

from apps.jobs.models import JobAttempt
from tests.admission.conftest import TRAIN, placed_ids


def ts(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


def test_a_queued_job_is_estimated_to_start_when_the_gpus_ahead_of_it_free_up(as_user):
    bob = as_user("bob")
    running = bob.post(
        "/api/v1/jobs/", {**TRAIN, "gpus": 8, "max_runtime_seconds": 600}, format="json"
    ).json()
    placed_ids()
    first = bob.post(
        "/api/v1/jobs/", {**TRAIN, "gpus": 6, "max_runtime_seconds": 300}, format="json"
    ).json()
    second = bob.post(
        "/api/v1/jobs/", {**TRAIN, "gpus": 4, "max_runtime_seconds": 100}, format="json"
    ).json()
    small = bob.post(
        "/api/v1/jobs/", {**TRAIN, "gpus": 2, "max_runtime_seconds": 100}, format="json"
    ).json()

    placed_at = JobAttempt.objects.get(job_id=running["id"]).created_at
    first_at = ts(bob.get(f"/api/v1/jobs/{first['id']}/").json()["estimated_start_at"])
    listed = {j["id"]: j for j in bob.get("/api/v1/jobs/").json()["results"]}
    # The 8-GPU job ends at its max runtime; the 6-GPU job starts then, the 4-GPU one when it
    # ends (no backfill), and the 2-GPU one with it (nothing starts before a job ahead of it).
    assert abs(first_at - (placed_at + timedelta(seconds=600))) < timedelta(seconds=1)
    assert ts(listed[second["id"]]["estimated_start_at"]) - first_at == timedelta(seconds=300)
    assert ts(listed[small["id"]]["estimated_start_at"]) == ts(
        listed[second["id"]]["estimated_start_at"]
    )
    assert listed[running["id"]]["estimated_start_at"] is None  # not queued


def test_a_job_that_can_never_fit_is_refused_and_one_only_a_cordoned_node_fits_has_no_estimate(
    as_user,
):
    from apps.admission import estimates
    from apps.nodes.models import Node, NodeState
    from tests.factories import make_node

    estimates.forget()
    bob = as_user("bob")
    refused = bob.post("/api/v1/jobs/", {**TRAIN, "gpus": 16}, format="json")
    assert refused.status_code == 400 and "at most 8 per node" in refused.json()["gpus"][0]
    Node.objects.filter(pk=make_node("big", "H100-80GB", 16).pk).update(state=NodeState.CORDONED)
    job = bob.post("/api/v1/jobs/", {**TRAIN, "gpus": 16}, format="json").json()
    assert job["estimated_start_at"] is None


def test_positions_after_extending_the_replay_with_held_jobs_are_a_fresh_counts():
    """The held jobs are counted once and then as they arrive (`Estimator.extend`): the positions
    stay those of an estimator loaded with the whole queue at once."""
    from types import SimpleNamespace

    from apps.admission.estimates import Estimator, queued_row

    start = datetime(2026, 12, 7, 10, 0)

    def row(n: int, held: bool):
        return queued_row(
            f"job-{n}", "H100-80GB", 1, 1, 60, None, 2, 2, start + timedelta(seconds=n), held
        )

    def estimator(rows):
        return Estimator(
            now=start, capacity={"H100-80GB": 4}, running=[], queue=list(rows), typical={}
        )

    first = [row(n, held=n % 3 == 0) for n in range(6)]
    more = [row(n, held=n % 2 == 0) for n in range(6, 12)]
    kept = estimator(first)
    assert kept.position(SimpleNamespace(pk="job-1")) == 1  # counts the held ones (job-0, job-3)
    kept.extend(more[:3])
    kept.extend(more[3:])
    fresh = estimator(first + more)
    for n in range(12):
        job = SimpleNamespace(pk=f"job-{n}")
        assert kept.position(job) == fresh.position(job), n
