"""What the API, `/metrics`, the usage figures and the pages read of the GPU telemetry."""

from __future__ import annotations

import datetime as dt
from collections import defaultdict
from collections.abc import Iterator

from django.db.models import F, Q, Sum
from django.utils import timezone

from apps.jobs.models import ATTEMPT_ACTIVE, GpuAllocation, Job, JobEvent, JobState
from apps.platform.names import GPU_IDLE_KIND
from apps.telemetry.ingest import HEALTH_KIND
from apps.telemetry.models import GpuPoint, GpuSeries, JobGpuSummary
from apps.telemetry.series import KEEP_POINTS, MAX_POINTS, rebucket

MIB = 1 << 20
_NUMBER = {"type": "number", "nullable": True}
METRICS_SCHEMA = {  # job_metrics' answer, for the OpenAPI document
    "type": "object",
    "required": ["gpus", "samples", "summary"],
    "properties": {
        "gpus": {"type": "array", "items": {"type": "object", "properties": {
            "node": {"type": "string"}, "index": {"type": "integer"}, "uuid": {"type": "string"},
            "health": {"type": "string", "description": "its first error, when it has one"}}}},
        "samples": {"type": "array", "description": "at most 1,000 per GPU", "items": {
            "type": "object", "properties": {
                "t": {"type": "string", "format": "date-time"}, "node": {"type": "string"},
                "index": {"type": "integer"}, "util": {"type": "number", "minimum": 0, "maximum": 100},
                "memory_mib": {"type": "integer"}, "attempt": {"type": "integer"},
                "rank": {"type": "integer"}}}},
        "summary": {"type": "object", "properties": {
            "util_mean": _NUMBER, "util_max": _NUMBER, "memory_max_mib": _NUMBER,
            "idle_seconds": {"type": "number"}}},
    },
}  # fmt: skip


def _iso(t: float) -> str:
    return dt.datetime.fromtimestamp(t, tz=dt.UTC).isoformat(timespec="milliseconds")


def summary_of(summary: JobGpuSummary | None) -> dict:
    if summary is None or not summary.gpu_seconds:
        return {"util_mean": None, "util_max": None, "memory_max_mib": None, "idle_seconds": 0.0}
    return {
        "util_mean": round(summary.util_mean or 0.0, 1),
        "util_max": round(summary.util_max, 1),
        "memory_max_mib": summary.memory_max_mib,
        "idle_seconds": round(summary.idle_seconds, 1),
    }


def job_metrics(job: Job) -> dict:
    """`GET /api/v1/jobs/{id}/metrics/` (../shared/API.md, "GPU telemetry"): the job's GPUs,
    their samples (at most MAX_POINTS per GPU, over all attempts) and its summary."""
    rows = (
        GpuSeries.objects.filter(job=job)
        .select_related("attempt")
        .order_by("attempt__number", "rank", "gpu_index")
    )
    gpus: dict[tuple[str, int], dict] = {}
    points: dict[tuple[str, int], list[tuple[list, int, int]]] = defaultdict(list)
    of_series = {}
    for row in rows:
        key = (row.node, row.gpu_index)
        gpus.setdefault(key, {"node": row.node, "index": row.gpu_index, "uuid": row.gpu_uuid})
        if row.health:
            gpus[key]["health"] = row.health
        of_series[row.pk] = (key, row.attempt.number, row.rank)
    found_points = GpuPoint.objects.filter(series__job=job).order_by("t")
    for series, *point in found_points.values_list(
        "series_id", "t", "util", "memory_mib", "seconds"
    ):
        key, number, rank = of_series[series]
        points[key].append((point, number, rank))
    samples = []
    for (node, index), found in points.items():
        found.sort(key=lambda item: item[0][0])
        if len(found) > MAX_POINTS:  # one GPU in several attempts: each attempt's merged alone
            span = found[-1][0][0] - found[0][0][0]
            bucket = max(span / KEEP_POINTS, 1e-3)
            by_attempt: dict[tuple[int, int], list] = defaultdict(list)
            for p, attempt, rank in found:
                by_attempt[(attempt, rank)].append(p)
            found = sorted(((p, a, r) for (a, r), ps in by_attempt.items() for p in rebucket(ps, bucket)),
                           key=lambda item: item[0][0])  # fmt: skip
        for (t, util, memory, _), attempt, rank in found:
            samples.append({"t": _iso(t), "node": node, "index": index, "util": util,
                            "memory_mib": memory, "attempt": attempt, "rank": rank})  # fmt: skip
    samples.sort(key=lambda s: (s["t"], s["node"], s["index"]))
    summary = JobGpuSummary.objects.filter(job=job).first()
    return {"gpus": list(gpus.values()), "samples": samples, "summary": summary_of(summary)}


def log_notices(job: Job) -> dict[int, bytes]:
    """The platform's GPU notices (idle warnings, unhealthy GPUs) for `gpuplatform logs`, by
    attempt number: one line each, after that attempt's own log."""
    rows = JobEvent.objects.filter(job=job, kind__in=(GPU_IDLE_KIND, HEALTH_KIND)).order_by("pk")
    lines: dict[int, list[str]] = defaultdict(list)
    for number, at, reason in rows.values_list("attempt__number", "created_at", "reason"):
        lines[number or 0].append(f"[gpuplatform {at.isoformat(timespec='seconds')}] {reason}\n")
    return {number: "".join(found).encode() for number, found in lines.items()}


def new_samples(event) -> dict:
    """Answer to GpuSamplesWanted (the event streams): per job, the samples newer than its mark,
    each with `at` (Unix time) besides the API's fields, in time order."""
    found: dict = defaultdict(list)
    marks = event.after
    rows = GpuSeries.objects.filter(job_id__in=list(marks), last_t__gt=min(marks.values()))
    newer = GpuPoint.objects.filter(series__in=rows, t__gt=min(marks.values())).values_list(
        "series__job_id", "series__node", "series__gpu_index", "t", "util", "memory_mib"
    )
    for job_id, node, index, t, util, memory in newer:
        if t > marks.get(job_id, marks.get(str(job_id), 0.0)):
            found[job_id].append({"at": t, "t": _iso(t), "node": node, "index": index,
                                  "util": util, "memory_mib": memory})  # fmt: skip
    for samples in found.values():
        samples.sort(key=lambda s: s["at"])
    return dict(found)


def running_gauges() -> Iterator[tuple[str, str, str, int, float, int]]:
    """(tenant, job, node, gpu, util, memory bytes) of every GPU of a running job's live
    attempt, as last sampled: a job's series leave `/metrics` as soon as it ends."""
    rows = (
        GpuSeries.objects.filter(job__state=JobState.RUNNING, attempt__state__in=ATTEMPT_ACTIVE)
        .exclude(last_util=None)
        .order_by("job_id", "node", "gpu_index")
        .values_list("job__tenant__slug", "job_id", "node", "gpu_index", "last_util",
                     "last_memory_mib")
    )  # fmt: skip
    for tenant, job_id, node, index, util, memory in rows:
        yield tenant, str(job_id), node, index, float(util or 0), int(memory or 0) * MIB


def _allocated(tenant_id: int, start: dt.datetime, now: dt.datetime) -> dict[int, float]:
    """GPU-hours the tenant's attempts held per user since `start` (as the GPU-hours quota)."""
    rows = GpuAllocation.objects.filter(attempt__job__tenant_id=tenant_id, allocated_at__lt=now)
    rows = rows.filter(Q(released_at=None) | Q(released_at__gt=start))
    hours: dict[int, float] = defaultdict(float)
    for user, allocated_at, released_at in rows.values_list(
        "attempt__job__user_id", "allocated_at", "released_at"
    ):
        seconds = (min(released_at or now, now) - max(allocated_at, start)).total_seconds()
        hours[user] += max(0.0, seconds) / 3600
    return hours


def _utilized(tenant_id: int, start: dt.datetime) -> dict[int, float]:
    """GPU-hours weighted by utilisation per user, from the samples since `start`."""
    rows = (
        GpuPoint.objects.filter(series__job__tenant_id=tenant_id, t__gte=start.timestamp())
        .values("series__job__user_id")
        .annotate(used=Sum(F("util") * F("seconds")))
        .values_list("series__job__user_id", "used")
    )
    return {user: (used or 0.0) / 100 / 3600 for user, used in rows}


def utilization_usage(tenant, start: dt.datetime, now: dt.datetime | None = None) -> dict:
    """`gpu_hours_utilized` and `gpu_efficiency` for the tenant since `start`, and per user
    (`by_user`), for `GET /api/v1/usage/`."""
    now = now or timezone.now()
    allocated = _allocated(tenant.pk, start, now)
    utilized = _utilized(tenant.pk, start)
    from django.contrib.auth import get_user_model

    users = dict(
        get_user_model()
        .objects.filter(pk__in=set(allocated) | set(utilized))
        .values_list("pk", "username")
    )
    by_user = [
        _figures(allocated.get(pk, 0.0), utilized.get(pk, 0.0), user=name)
        for pk, name in sorted(users.items(), key=lambda item: item[1])
    ]
    total = _figures(sum(allocated.values()), sum(utilized.values()))
    return {**total, "by_user": by_user}


def _figures(allocated: float, utilized: float, **extra) -> dict:
    efficiency = min(1.0, utilized / allocated) if allocated > 0 else 0.0
    return {**extra, "gpu_hours_allocated": round(allocated, 4),
            "gpu_hours_utilized": round(utilized, 4), "gpu_efficiency": round(efficiency, 3)}  # fmt: skip
