"""GPU telemetry on the web (apps/telemetry): samples arrive with a node's heartbeat and count
only for that node's own members and GPUs; each (attempt, GPU) series stays within 1,000
points, coarser as it ages; the job's summary, its metrics endpoint (another tenant 404), the
per-job `/metrics` gauges of running jobs only, the usage figures, and retention."""

import time

import pytest
from django.test import override_settings

from apps.jobs import services
from apps.nodes.credentials import issue_credential
from apps.nodes.models import Gpu
from apps.telemetry.models import GpuPoint, GpuSeries, JobGpuSummary
from apps.telemetry.series import KEEP_POINTS, MAX_POINTS, add
from tests.factories import client_for, make_node
from tests.unit.test_agent_api import bearer
from tests.unit.test_dispatcher import dispatch_once, submit

API = "/internal/agent/v1"


def running(cast, user="bob", gpus=2, nodes=1):
    job = submit(cast, user, gpus=gpus, nodes=nodes)
    dispatch_once()
    attempt = job.attempts.get()
    for member in attempt.members.all():
        services.attempt_member_started(attempt_id=attempt.pk, rank=member.rank,
                                        token=str(attempt.token), pid=1)  # fmt: skip
    job.refresh_from_db()
    return job, attempt


def heartbeat(node: str, samples: list[dict], *, instance: str = "i1"):
    from apps.nodes.models import Node

    Node.objects.filter(name=node).update(agent_instance=instance)
    client = bearer(issue_credential(node_name=node)[1])
    body = {"agent_instance": instance, "gpus": [], "samples": samples}
    return client.post(f"{API}/heartbeat/", body, format="json")


def sample(attempt, index, t, util, memory=1000, rank=0, seconds=1.0, **extra):
    return {"t": t, "index": index, "attempt_id": attempt.pk, "rank": rank, "util": util,
            "memory_mib": memory, "seconds": seconds, **extra}  # fmt: skip


def test_a_series_never_passes_1000_points_and_gets_coarser_as_it_ages():
    points, bucket = [], 0.0
    for i in range(0, 10_000, 5):  # a heartbeat of 5 samples
        points, bucket = add(points, bucket, [[1000.0 + i + k, 50.0, i + k, 1.0] for k in range(5)])
        assert len(points) <= MAX_POINTS
    assert bucket >= 10_000 / 2 / KEEP_POINTS  # half the span in at most KEEP_POINTS buckets
    assert points[0][0] == 1000.0 and points[-1][2] == 9999  # memory: each bucket's highest
    assert points[0][3] >= 10 and points[-1][3] == 1.0  # the oldest coarse, the newest a sample
    assert sum(p[3] for p in points) == pytest.approx(10_000)  # no second lost in the merges
    assert all(p[1] == pytest.approx(50.0) for p in points)


def stored(series) -> list[list]:
    return [list(p) for p in series.points.order_by("t").values_list("t", "util", "memory_mib",
                                                                        "seconds")]  # fmt: skip


def test_heartbeats_append_their_samples_and_keep_each_series_within_1000_points(cast):
    make_node("h1", gpus=2)
    job, attempt = running(cast, gpus=1)
    (index,) = attempt.members.get().gpu_indices
    start = time.time() - 3000
    for beat in range(300):  # 2,400 samples, 8 a heartbeat
        heartbeat("h1", [sample(attempt, index, start + beat * 8 + k, 50)
                         for k in range(8)])  # fmt: skip
        series = GpuSeries.objects.get()
        assert series.point_count == series.points.count() <= MAX_POINTS
    points = stored(series)
    assert points[0][0] == pytest.approx(start) and points[-1][0] == pytest.approx(start + 2399)
    assert points[0][3] > 1 and points[-1][3] == 1.0  # older points coarser, the newest a sample
    assert series.bucket_seconds >= 2000 / KEEP_POINTS
    assert sum(p[3] for p in points) == pytest.approx(2400)  # no second lost in the merges
    assert all(p[1] == pytest.approx(50.0) for p in points)
    summary = JobGpuSummary.objects.get(job=job)
    assert summary.gpu_seconds == pytest.approx(2400) and summary.util_mean == pytest.approx(50)


def test_a_heartbeats_write_grows_with_its_samples_not_with_the_series(cast):
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    make_node("h1", gpus=2)
    job, attempt = running(cast, gpus=1)
    (index,) = attempt.members.get().gpu_indices
    start = time.time() - 3000

    def written(beat: int) -> int:
        """Characters of SQL that write, for one heartbeat of 4 samples."""
        batch = [sample(attempt, index, start + beat * 4 + k, 50) for k in range(4)]
        with CaptureQueriesContext(connection) as queries:
            heartbeat("h1", batch)
        writes = [q["sql"] for q in queries.captured_queries
                  if q["sql"].lstrip().upper().startswith(("INSERT", "UPDATE", "DELETE"))]  # fmt: skip
        assert not any("DELETE" in w.upper() and "gpupoint" in w.lower() for w in writes)
        return sum(len(w) for w in writes)

    first = written(0)
    for beat in range(1, 200):  # the series at 800 points
        heartbeat("h1", [sample(attempt, index, start + beat * 4 + k, 50) for k in range(4)])
    assert GpuSeries.objects.get().point_count == 800
    assert written(200) < first * 1.2  # (the JSON list it replaced wrote 12 times more)


def test_samples_count_only_for_the_nodes_own_members_and_their_gpus(cast):
    make_node("h1", gpus=4)
    make_node("h2", gpus=4)
    job, attempt = running(cast, gpus=2)
    node = attempt.members.get().node.name
    other = "h2" if node == "h1" else "h1"
    held = attempt.members.get().gpu_indices
    free = next(i for i in range(4) if i not in held)
    now = time.time()
    good = [sample(attempt, held[0], now - 2, 90), sample(attempt, held[1], now - 2, 80)]
    bad = [sample(attempt, free, now - 2, 90), {"t": "x"}, sample(attempt, held[0], now + 3600, 5),
           sample(attempt, held[0], now - 1, 101), "junk"]  # fmt: skip
    answer = heartbeat(node, good + bad)
    assert answer.status_code == 200 and "members" in answer.json()  # bad samples never fail it
    assert heartbeat(other, [sample(attempt, held[0], now - 1, 0)]).status_code == 200
    rows = {s.gpu_index: s for s in GpuSeries.objects.all()}
    assert set(rows) == set(held)  # nothing on the free GPU, nothing from the other node
    assert stored(rows[held[0]]) == [[round(now - 2, 3), 90.0, 1000, 1.0]]
    assert rows[held[0]].gpu_uuid == Gpu.objects.get(node__name=node, index=held[0]).uuid
    heartbeat(node, good)  # sent again (a heartbeat that timed out): not counted twice
    summary = JobGpuSummary.objects.get(job=job)
    assert summary.gpu_seconds == 2.0 and summary.util_mean == pytest.approx(85.0)


def test_the_metrics_endpoint_gives_gpus_samples_and_summary_and_404_to_another_tenant(cast):
    make_node("h1", gpus=4)
    job, attempt = running(cast, gpus=2)
    held = attempt.members.get().gpu_indices
    now = time.time()
    heartbeat("h1", [sample(attempt, i, now - 3 + k, util, memory=2000 + k)
                     for k, util in enumerate((100, 0)) for i in held])  # fmt: skip
    answer = client_for(cast["bob"][1]).get(f"/api/v1/jobs/{job.pk}/metrics/")
    assert answer.status_code == 200
    body = answer.json()
    assert [(g["node"], g["index"]) for g in body["gpus"]] == [("h1", i) for i in held]
    assert all(g["uuid"].startswith("GPU-h1-") for g in body["gpus"])
    assert len(body["samples"]) == 4
    first = body["samples"][0]
    assert set(first) >= {"t", "node", "index", "util", "memory_mib"} and first["t"].endswith(
        "+00:00"
    )
    # Idle: the second (the last) second, on both GPUs.
    assert body["summary"] == {"util_mean": 50.0, "util_max": 100.0, "memory_max_mib": 2001,
                               "idle_seconds": 1.0}  # fmt: skip
    assert client_for(cast["dave"][1]).get(f"/api/v1/jobs/{job.pk}/metrics/").status_code == 404
    assert client_for(cast["alice"][1]).get(f"/api/v1/jobs/{job.pk}/metrics/").status_code == 200


def test_metrics_gauges_cover_running_jobs_only(cast, client):
    make_node("h1", gpus=4)
    job, attempt = running(cast, gpus=1)
    (index,) = attempt.members.get().gpu_indices
    heartbeat("h1", [sample(attempt, index, time.time() - 1, 73, memory=1536)])
    labels = {"gpu": str(index), "job": str(job.pk), "node": "h1", "tenant": "acme"}
    assert gauges(client, "gpuplatform_job_gpu_utilization") == [(labels, 73.0)]
    assert gauges(client, "gpuplatform_job_gpu_memory_bytes") == [(labels, 1536 << 20)]
    services.job_cancel(job=job, actor="user:bob")
    assert gauges(client, "gpuplatform_job_gpu_utilization") == []  # gone at its end
    assert str(job.pk) not in client.get("/metrics").content.decode()


def gauges(client, name: str) -> list[tuple[dict, float]]:
    from prometheus_client.parser import text_string_to_metric_families

    text = client.get("/metrics").content.decode()
    return [(s.labels, s.value) for f in text_string_to_metric_families(text) for s in f.samples
            if s.name == name]  # fmt: skip


def test_usage_gives_utilized_gpu_hours_and_efficiency_per_tenant_and_user(cast):
    make_node("h1", gpus=4)
    job, attempt = running(cast, "bob", gpus=2)
    other, other_attempt = running(cast, "alice", gpus=1)
    # Held for half an hour: a job started a moment ago has held its GPUs ~0.0000 hours, which
    # rounds to nothing on a fast run.
    from datetime import timedelta

    from django.utils import timezone

    from apps.jobs.models import GpuAllocation

    GpuAllocation.objects.filter(attempt__in=[attempt, other_attempt]).update(
        allocated_at=timezone.now() - timedelta(minutes=30)
    )
    now = time.time()
    held = attempt.members.get().gpu_indices
    heartbeat("h1", [sample(attempt, i, now - 1, 50, seconds=360) for i in held]
              + [sample(other_attempt, other_attempt.members.get().gpu_indices[0], now - 1, 0,
                        seconds=360)])  # fmt: skip
    body = client_for(cast["bob"][1]).get("/api/v1/usage/").json()
    assert body["gpu_hours_utilized"] == pytest.approx(0.1)  # 2 GPUs x 0.1 h x 50%
    users = {u["user"]: u for u in body["by_user"]}
    assert users["bob"]["gpu_hours_utilized"] == pytest.approx(0.1)
    assert users["alice"]["gpu_hours_utilized"] == 0.0
    assert 0 <= body["gpu_efficiency"] <= 1 and users["bob"]["gpu_hours_allocated"] > 0
    assert client_for(cast["dave"][1]).get("/api/v1/usage/").json()["by_user"] == []


def test_an_unhealthy_gpu_gives_its_job_an_event(cast):
    make_node("h1", gpus=2)
    job, attempt = running(cast, gpus=1)
    (index,) = attempt.members.get().gpu_indices
    now = time.time()
    heartbeat("h1", [sample(attempt, index, now - 2, 90, health="xid 79"),
                     sample(attempt, index, now - 1, 90, health="xid 79")])  # fmt: skip
    (event,) = job.events.filter(kind="gpu.health")
    assert "xid 79" in event.reason and f"h1:{index}" in event.reason


@override_settings(TELEMETRY_RETENTION_DAYS=1)
def test_series_of_jobs_ended_past_the_retention_go_their_summary_stays(cast):
    from datetime import timedelta

    from django.utils import timezone

    from apps.telemetry.tasks import purge

    make_node("h1", gpus=2)
    job, attempt = running(cast, gpus=1)
    heartbeat("h1", [sample(attempt, attempt.members.get().gpu_indices[0], time.time() - 1, 9)])
    services.job_cancel(job=job, actor="user:bob")
    assert purge() == 0  # ended just now
    assert purge(now=timezone.now() + timedelta(days=2)) == 1
    assert not GpuSeries.objects.exists() and JobGpuSummary.objects.filter(job=job).exists()


def test_a_gpu_used_by_several_attempts_still_gives_at_most_1000_samples(cast):
    from apps.jobs.models import JobAttempt
    from apps.telemetry.read import job_metrics

    make_node("h1", gpus=2)
    job, attempt = running(cast, gpus=1)
    second = JobAttempt.objects.create(job=job, number=2, state="cancelled")
    start = time.time() - 5000
    for number, row_attempt in enumerate((attempt, second)):
        points = [[start + 2000 * number + i, 40.0, 100, 1.0] for i in range(800)]
        series = GpuSeries.objects.create(job=job, attempt=row_attempt, node="h1", gpu_index=0,
                                          point_count=len(points), last_t=points[-1][0])  # fmt: skip
        GpuPoint.objects.bulk_create(GpuPoint(series=series, t=t, util=u, memory_mib=m, seconds=s)
                                     for t, u, m, s in points)  # fmt: skip
    body = job_metrics(job)
    assert len(body["gpus"]) == 1 and 200 <= len(body["samples"]) <= MAX_POINTS
    assert [s["t"] for s in body["samples"]] == sorted(s["t"] for s in body["samples"])
    first = [s for s in body["samples"] if s["attempt"] == 1]
    assert 0 < len(first) < len(body["samples"])  # each point keeps its own attempt
    assert max(s["t"] for s in first) < min(s["t"] for s in body["samples"] if s["attempt"] == 2)
