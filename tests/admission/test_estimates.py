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


def _queued(n: int, start: datetime, *, sku="H100-80GB", gpus=1, level=2, runtime=60, held=False):
    from apps.admission.estimates import queued_row

    return queued_row(
        f"job-{n}", sku, gpus, 1, runtime, None, level, 2, start + timedelta(seconds=n), held
    )


def _estimator(rows, start: datetime, running=()):
    from apps.admission.estimates import Estimator

    return Estimator(now=start, capacity={"H100-80GB": 8, "A100-40GB": 4}, running=list(running),
                     queue=sorted(rows, key=lambda r: r.order), typical={})  # fmt: skip


def _answers(estimator, rows) -> dict:
    from types import SimpleNamespace

    jobs = [SimpleNamespace(pk=row.pk, state="queued") for row in rows]
    return {job.pk: (estimator.position(job), estimator.estimate(job)) for job in jobs}


def test_a_replay_extended_with_late_and_early_arrivals_estimates_as_one_loaded_at_once():
    """`Estimator.extend` goes on from each pool's end, from a mark of its trail (a job created
    before the newest one, committed after it) or from the head (a better tier): whichever, every
    estimate and position is the one a fresh load of the same queue gives."""
    import random

    from apps.admission.estimates import ANY, TRAIL

    start = datetime(2026, 12, 7, 10, 0)
    running = [("H100-80GB", start + timedelta(seconds=30), 8), ("A100-40GB", start, 2)]
    for seed in range(12):
        rng = random.Random(seed)
        rows = [
            _queued(
                n,
                start,
                sku=rng.choice(["H100-80GB", "H100-80GB", "A100-40GB", ANY]),
                gpus=rng.choice([1, 1, 2, 4, 8, 12]),
                runtime=rng.choice([10, 60, 600]),
                level=2 if rng.random() > 0.03 else 3,
                held=rng.random() < 0.05,
            )  # fmt: skip
            for n in range(rng.randint(0, 3 * TRAIL), 6 * TRAIL)
        ]
        split = rng.randint(0, 2 * TRAIL)
        loaded, arriving = rows[:split], rows[split:]
        # Arrivals in batches, each a little out of created_at's order, some much.
        arriving.sort(key=lambda r: r.order[2] + timedelta(seconds=rng.choice([0, 0, 3, 40])))
        kept = _estimator(loaded, start, running)
        _answers(kept, loaded)  # every pool replayed before the arrivals
        while arriving:
            size = rng.randint(1, 5)
            batch, arriving = arriving[:size], arriving[size:]
            kept.extend(batch)
            if rng.random() < 0.05:
                have = kept.queue
                assert _answers(kept, have) == _answers(_estimator(have, start, running), have)
        assert _answers(kept, rows) == _answers(_estimator(rows, start, running), rows), seed


def test_a_late_arrival_replays_its_pool_from_a_mark_not_from_the_head(monkeypatch):
    """A job created just before the newest one of the replay but committed after it (several
    web threads submit at once) is replayed from the trail's mark before it: the pool's replay
    does not start again at the head of the queue."""
    from apps.admission.estimates import Estimator

    start = datetime(2026, 12, 7, 10, 0)
    rows = [_queued(n, start) for n in range(300)]
    kept = _estimator(rows[:200] + rows[201:220], start)
    _answers(kept, rows[:1])
    kept.extend(rows[220:230])
    from_head = []
    replay = Estimator._replay
    monkeypatch.setattr(
        Estimator, "_replay", lambda *a, **k: from_head.append(1) or replay(*a, **k)
    )
    kept.extend([rows[200]])  # late: sorts before the last 29
    kept.extend(rows[230:300])
    assert from_head == []
    assert _answers(kept, rows) == _answers(_estimator(rows, start), rows)
    from_head.clear()  # (the fresh estimator's)
    kept.extend([_queued(1000, start, level=3)])  # a better tier: ahead of the whole queue
    assert from_head == [1]
