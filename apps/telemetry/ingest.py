"""GPU samples from a node's heartbeat (workers/telemetry.py) into the series and summaries.

A node may only speak for its own members: a sample counts only when its attempt member is
open on that node and holds that GPU (as the agent API's fencing, docs/architecture.md);
anything else, or a sample that does not parse, is dropped (never an error: a heartbeat must
not fail for its telemetry)."""

from __future__ import annotations

import logging
import math
import time
from collections import defaultdict
from dataclasses import dataclass

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from apps.jobs.models import AttemptMember
from apps.jobs.services import record_event
from apps.nodes.models import Gpu
from apps.telemetry import idle
from apps.telemetry.models import GpuPoint, GpuSeries, JobGpuSummary
from apps.telemetry.series import MAX_POINTS, compact

log = logging.getLogger(__name__)
MAX_SAMPLES = 5000  # per heartbeat; the agent keeps at most this many while the web is away
HEALTH_KIND = "gpu.health"
SAVED = ("point_count", "bucket_seconds", "last_t", "last_util", "last_memory_mib", "idle_since",
         "util_max", "memory_max_mib", "health", "updated_at")  # fmt: skip


@dataclass(frozen=True)
class Sample:
    t: float
    index: int
    attempt_id: int
    rank: int
    util: float
    memory_mib: int
    seconds: float
    health: str = ""
    active: bool = False  # its member's sessions carried a byte meanwhile (typing, output)


def parse(raw, now: float) -> list[Sample]:
    """The well-formed samples of a heartbeat body's `samples`, in time order."""
    if not isinstance(raw, list):
        return []
    out = []
    for item in raw[:MAX_SAMPLES]:
        try:
            sample = Sample(
                t=float(item["t"]), index=int(item["index"]), attempt_id=int(item["attempt_id"]),
                rank=int(item["rank"]), util=float(item["util"]), memory_mib=int(item["memory_mib"]),
                seconds=float(item.get("seconds", 0)), health=str(item.get("health", ""))[:32],
                active=item.get("active") is True,
            )  # fmt: skip
        except (TypeError, KeyError, ValueError, AttributeError):
            continue
        numbers = (sample.t, sample.util, sample.seconds)
        if not all(math.isfinite(n) for n in numbers) or not 0 <= sample.index < 64:
            continue
        if not (now - 3600 <= sample.t <= now + 60 and 0 <= sample.util <= 100):
            continue
        if not (0 <= sample.memory_mib < 1 << 24 and 0 <= sample.seconds <= 3600):
            continue
        out.append(sample)
    out.sort(key=lambda s: s.t)
    return out


def ingest(node_name: str, raw) -> int:
    """Store a heartbeat's samples; the number kept. A failure here is logged, never raised:
    the heartbeat it rides must still count."""
    samples = parse(raw, time.time())
    if not samples:
        return 0
    try:
        return _ingest(node_name, samples)
    except Exception:
        log.exception("GPU samples of node %s dropped", node_name)
        return 0


def _ingest(node_name: str, samples: list[Sample]) -> int:
    with transaction.atomic():
        members = {
            (m.attempt_id, m.rank): m
            for m in AttemptMember.objects.filter(
                node__name=node_name, ended_at=None,
                attempt_id__in={s.attempt_id for s in samples},
            ).select_related("attempt__job__tier", "attempt__job__tenant")
        }  # fmt: skip
        wanted: dict[tuple[int, int, int], list[Sample]] = defaultdict(list)
        for sample in samples:
            member = members.get((sample.attempt_id, sample.rank))
            if member is not None and sample.index in member.gpu_indices:
                wanted[(sample.attempt_id, sample.rank, sample.index)].append(sample)
        if not wanted:
            return 0
        series = _series(node_name, members, wanted)
        by_job: dict = defaultdict(list)
        appended: list[tuple[GpuSeries, list[Sample]]] = []
        for key, rows in wanted.items():
            row = series[key]
            fresh, new_error = _apply(row, rows)
            if fresh:  # else all of them stored already (a heartbeat sent again)
                appended.append((row, fresh))
                by_job[row.job_id].append((row, fresh, new_error))
        # The new samples appended, one INSERT for the heartbeat: its write grows with its
        # samples, not with its series (apps/telemetry/series.py).
        GpuPoint.objects.bulk_create(
            GpuPoint(series=row, t=round(s.t, 3), util=round(s.util, 2), memory_mib=s.memory_mib,
                     seconds=round(s.seconds, 3))
            for row, fresh in appended for s in fresh
        )  # fmt: skip
        for row, _ in appended:
            if row.point_count > MAX_POINTS:
                _compact(row)
            # One plain UPDATE a row (bulk_update builds a CASE per field and row).
            GpuSeries.objects.filter(pk=row.pk).update(**{f: getattr(row, f) for f in SAVED})
        for _, updates in sorted(by_job.items(), key=lambda item: str(item[0])):  # jobs in order
            member = members[(updates[0][0].attempt_id, updates[0][0].rank)]
            _summarise(member, updates)
    return sum(len(fresh) for _, fresh in appended)


def _series(node_name: str, members: dict, wanted: dict) -> dict[tuple[int, int, int], GpuSeries]:
    found = {
        (s.attempt_id, s.rank, s.gpu_index): s
        for s in GpuSeries.objects.select_for_update().filter(
            attempt_id__in={k[0] for k in wanted}, node=node_name
        )
    }
    missing = [k for k in wanted if k not in found]
    if missing:
        uuids = dict(Gpu.objects.filter(node__name=node_name).values_list("index", "uuid"))
        GpuSeries.objects.bulk_create(
            [
                GpuSeries(job_id=members[k[:2]].attempt.job_id, attempt_id=k[0], rank=k[1],
                          node=node_name, gpu_index=k[2], gpu_uuid=uuids.get(k[2], ""))
                for k in missing
            ],
            ignore_conflicts=True,
        )  # fmt: skip
        found.update(
            ((s.attempt_id, s.rank, s.gpu_index), s)
            for s in GpuSeries.objects.select_for_update().filter(
                attempt_id__in={k[0] for k in missing}, node=node_name
            )
        )
    return found


def _apply(row: GpuSeries, samples: list[Sample]) -> tuple[list[Sample], bool]:
    """Add the samples newer than the series' last to it: those samples, and whether the GPU's
    first error came with them."""
    threshold = settings.GPU_IDLE_UTIL
    fresh, new_error = [], False
    row.updated_at = timezone.now()  # update() sets no auto_now
    for s in samples:
        if s.t <= row.last_t:
            continue  # already stored (a heartbeat sent again)
        fresh.append(s)
        row.last_t, row.last_util, row.last_memory_mib = s.t, s.util, s.memory_mib
        row.util_max = max(row.util_max, s.util)
        row.memory_max_mib = max(row.memory_max_mib, s.memory_mib)
        if s.util < threshold and not s.active:  # typing in a session: in use (idle.py)
            row.idle_since = row.idle_since if row.idle_since is not None else s.t - s.seconds
        else:
            row.idle_since = None
        if s.health and not row.health:
            row.health, new_error = s.health, True
    row.point_count += len(fresh)
    return fresh, new_error


def _compact(row: GpuSeries) -> None:
    """The series past MAX_POINTS merged into coarser buckets (apps/telemetry/series.py): its
    points rewritten, once per MAX_POINTS - KEEP_POINTS samples."""
    points = [
        list(p) for p in row.points.order_by("t").values_list("t", "util", "memory_mib", "seconds")
    ]
    merged, row.bucket_seconds = compact(points, row.bucket_seconds)
    row.points.all().delete()
    GpuPoint.objects.bulk_create(
        GpuPoint(series=row, t=t, util=util, memory_mib=memory, seconds=seconds)
        for t, util, memory, seconds in merged
    )
    row.point_count = len(merged)


def _summarise(member: AttemptMember, updates: list[tuple[GpuSeries, list[Sample], bool]]) -> None:
    job = member.attempt.job
    JobGpuSummary.objects.get_or_create(job_id=job.pk)
    summary = JobGpuSummary.objects.select_for_update().get(job_id=job.pk)
    for row, samples, new_error in updates:
        for s in samples:
            summary.gpu_seconds += s.seconds
            summary.util_gpu_seconds += s.util / 100.0 * s.seconds
            summary.util_max = max(summary.util_max, s.util)
            summary.memory_max_mib = max(summary.memory_max_mib, s.memory_mib)
        if new_error:
            record_event(
                job, kind=HEALTH_KIND, actor=f"agent:{row.node}", attempt=member.attempt,
                reason=f"GPU {row.node}:{row.gpu_index} is unhealthy ({row.health}); it takes no new work",
                data={"node": row.node, "index": row.gpu_index, "health": row.health},
            )  # fmt: skip
    idle.evaluate(job, member.attempt, summary)
    summary.save()
