"""`estimated_start_at` of queued jobs: a replay of the queue, one GPU pool at a time.

Method (docs/admission.md): for each SKU, free GPUs = healthy GPUs on ready nodes minus those
held now. Running attempts give their GPUs back at their expected end: start + the expected
runtime. Queued jobs are then taken in queue order (`queue_position`'s order) and each starts
as soon as enough GPUs are free, holding them for its own expected runtime. No backfill, no
preemption, no fragmentation across nodes: the estimate errs late for small jobs and early for
big gangs. Expected runtime: the median of the template's last 50 finished runs (at least 3)
capped by the job's `max_runtime_seconds`, else `max_runtime_seconds`. A job naming no SKU is
estimated against the whole cluster. None when the job can never fit (or nothing will free).
"""

from __future__ import annotations

import heapq
import statistics
from collections import defaultdict
from datetime import datetime, timedelta
from typing import NamedTuple

from django.db.models import Count
from django.utils import timezone

from apps.jobs.models import ATTEMPT_ACTIVE, AttemptState, GpuAllocation, Job, JobAttempt, JobState
from apps.nodes.models import Gpu, GpuHealth, NodeState

ANY = "*"
QUEUE_LIMIT = 1000  # queued jobs replayed; a job further back gets no estimate


class Queued(NamedTuple):
    """What the replay needs of a queued job (plain rows: a list response must stay cheap)."""

    pk: object
    sku: str
    gpus: int
    nodes: int
    max_runtime_seconds: int
    template_id: int | None


class Estimator:
    def __init__(self, *, now: datetime, capacity: dict[str, int], running: list[tuple[str, datetime, int]],
                 queue: list[Queued], typical: dict[int, float]):  # fmt: skip
        self.now, self.capacity, self.running, self.queue, self.typical = now, capacity, running, queue, typical
        self._starts: dict | None = None

    @classmethod
    def load(cls) -> Estimator:
        from apps.scheduling.dispatcher import queue_order

        now = timezone.now()
        fields = ("pk", "gpu_sku__name", "gpus", "nodes", "max_runtime_seconds", "template_id")
        queue = [Queued(pk, sku or ANY, *rest) for pk, sku, *rest in queue_order().values_list(*fields)[:QUEUE_LIMIT]]
        held = _held()
        templates = {j.template_id for j in queue} | {a.job.template_id for a, _ in held}
        typical = _typical_runtimes({t for t in templates if t})
        running = []
        for attempt, by_sku in held:
            end = attempt.started_at or attempt.created_at
            end += timedelta(seconds=_runtime(attempt.job, typical))
            if attempt.state not in ATTEMPT_ACTIVE:
                end = now  # stopping: its processes are on their way out
            running += [(sku, max(end, now), n) for sku, n in by_sku.items()]
        return cls(now=now, capacity=_capacity(), running=running, queue=queue, typical=typical)

    def runtime(self, job: Queued | Job) -> float:
        return _runtime(job, self.typical)

    def estimate(self, job: Job) -> datetime | None:
        if job.state != JobState.QUEUED:
            return None
        if self._starts is None:
            self._starts = {}
            for pool in {ANY, *self.capacity}:
                self._starts.update(self._replay(pool))
        return self._starts.get(job.pk)

    def _replay(self, pool: str) -> dict:
        capacity = self.capacity.get(pool, 0) if pool != ANY else sum(self.capacity.values())
        releases = [(end, n) for sku, end, n in self.running if pool in (ANY, sku)]
        free = capacity - sum(n for _, n in releases)
        heapq.heapify(releases)
        t, starts = self.now, {}
        for job in self.queue:
            if job.sku != pool:
                continue
            need = job.gpus * job.nodes
            if need > capacity:
                continue
            while free < need and releases:
                end, n = heapq.heappop(releases)
                t, free = max(t, end), free + n
            if free < need:
                continue
            starts[job.pk] = t
            free -= need
            heapq.heappush(releases, (t + timedelta(seconds=self.runtime(job)), need))
        return starts


def _capacity() -> dict[str, int]:
    rows = Gpu.objects.filter(node__state=NodeState.READY, health=GpuHealth.HEALTHY)
    return dict(rows.values_list("node__sku__name").annotate(n=Count("pk")))


def _runtime(job: Queued | Job, typical: dict[int, float]) -> float:
    usual = typical.get(job.template_id) if job.template_id else None
    return min(job.max_runtime_seconds, usual) if usual else float(job.max_runtime_seconds)


def _held() -> list[tuple[JobAttempt, dict[str, int]]]:
    """Every attempt holding GPUs, with how many per SKU."""
    held = defaultdict(lambda: defaultdict(int))
    for attempt_id, sku in GpuAllocation.objects.filter(released_at=None).values_list("attempt_id", "gpu__node__sku__name"):
        held[attempt_id][sku] += 1
    attempts = JobAttempt.objects.filter(pk__in=list(held)).select_related("job")
    return [(attempt, dict(held[attempt.pk])) for attempt in attempts]


def _typical_runtimes(template_ids: set[int]) -> dict[int, float]:
    typical = {}
    for template_id in template_ids:
        rows = (
            JobAttempt.objects.filter(job__template_id=template_id, state=AttemptState.SUCCEEDED,
                                      started_at__isnull=False, ended_at__isnull=False)  # fmt: skip
            .order_by("-ended_at")
            .values_list("started_at", "ended_at")[:50]
        )
        durations = [(end - start).total_seconds() for start, end in rows]
        if len(durations) >= 3:
            typical[template_id] = statistics.median(durations)
    return typical
