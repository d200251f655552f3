"""`estimated_start_at` of queued jobs: a replay of the queue, one GPU pool at a time.

Method (docs/admission.md): for each SKU, free GPUs = healthy GPUs on ready nodes minus those
held now. Running attempts give their GPUs back at their expected end: start + the expected
runtime. Queued jobs are then taken in queue order (`queue_position`'s order) and each starts
as soon as enough GPUs are free, holding them for its own expected runtime. No backfill, no
preemption, no fragmentation across nodes: the estimate errs late for small jobs and early for
big gangs. Expected runtime: the median of the template's last 50 finished runs (at least 3)
capped by the job's `max_runtime_seconds`, else `max_runtime_seconds`. A job naming no SKU is
estimated against the whole cluster. None when the job can never fit (or nothing will free).

The replay itself is apps/scheduling/core/estimate.py (pure), which the simulator runs too to
measure the method's error (apps/scheduling/sim/estimate.py); this module gathers its inputs.
"""

from __future__ import annotations

import bisect
import statistics
import threading
import time
from collections import defaultdict
from datetime import UTC, datetime, timedelta
from typing import NamedTuple

from django.db.models import Count
from django.utils import timezone

from apps.admission import fit, rows
from apps.jobs.models import ATTEMPT_ACTIVE, AttemptState, GpuAllocation, Job, JobAttempt, JobState
from apps.jobs.queue_order import sort_key, tier_key
from apps.nodes.models import Gpu, GpuHealth, NodeState
from apps.scheduling.core.estimate import Replay, Waiting

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
    order: tuple = ()  # its place in queue order (apps/jobs/queue_order.py sort_key)
    # Waiting for a dependency (docs/pipelines.md): in the queue, but not waiting for GPUs, so
    # the replay gives it no start and it takes no place in the queue positions.
    held: bool = False


def queued_row(
    pk, sku, gpus, nodes, max_runtime_seconds, template_id, level, rank, created_at, held=False
) -> Queued:
    return Queued(
        pk,
        sku or ANY,
        gpus,
        nodes,
        max_runtime_seconds,
        template_id,
        sort_key(level, rank, created_at),
        bool(held),
    )


class Estimator:
    def __init__(self, *, now: datetime, capacity: dict[str, int], running: list[tuple[str, datetime, int]],
                 queue: list[Queued], typical: dict[int, float]):  # fmt: skip
        self.now, self.capacity, self.running, self.queue, self.typical = (
            now,
            capacity,
            running,
            queue,
            typical,
        )
        self._pools: dict[str, _Pool] = {}  # pool -> its replay, once a job of it was estimated
        self._index: dict | None = None
        self._newest: datetime | None = None
        self._held: tuple[int, int] | None = None  # (queue length, held rows) when counted
        # The jobs the last queue windows read ({id: created_at}), all in the replay.
        self.window_ids: dict = {}

    @classmethod
    def load(cls) -> Estimator:
        now = timezone.now()
        queue = [
            queued_row(*row) for row in rows.queue(QUEUE_LIMIT)
        ]  # queue_order()'s first, without the ORM
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
        row = self.index().get(job.pk)
        if row is None:
            return None  # beyond the replayed part of the queue
        pool = row.sku
        if pool not in self._pools:
            self._pools[pool] = self._replay(pool)
        return self._pools[pool].starts.get(job.pk)

    def index(self) -> dict:
        """{pk: row} of the loaded queue."""
        if self._index is None:
            self._index = {row.pk: row for row in self.queue}
        return self._index

    def newest(self) -> datetime:
        """The latest submit time in the loaded queue."""
        if self._newest is None:
            self._newest = max(row.order[2] for row in self.queue)
        return self._newest

    def extend(self, rows: list[Queued]) -> None:
        """Add jobs queued since the load. Each pool's replay goes on from where its arrivals
        sort: jobs that sort after the pool's last one (the usual case: newer, of a tier no
        better) continue it from its end; a job that sorts among the pool's last TRAIL (created
        just before the newest one, committed after it: several web threads submit at once)
        replays it from the mark before it; any other arrival replays the pool from the head."""
        if not rows:
            return
        rows = sorted(rows, key=lambda r: r.order)
        for row in rows:
            bisect.insort(self.queue, row, key=lambda r: r.order)
            if self._index is not None:
                self._index[row.pk] = row
            self._newest = max(self._newest or row.order[2], row.order[2])
        if self._held is not None:  # counted on: a count of the whole queue was O(queue) a submit
            self._held = (len(self.queue), self._held[1] + sum(row.held for row in rows))
        for pool, replay in list(self._pools.items()):
            arrived = [row for row in rows if row.sku == pool and not row.held]
            if arrived:
                self._pools[pool] = self._go_back(pool, replay, arrived)

    def position(self, job: Job) -> int | None:
        """1-based place in queue order (`queue_position`), if the job is in the loaded queue;
        jobs held by their dependencies have none and take none."""
        held_after = 0
        for index in range(len(self.queue) - 1, -1, -1):  # a job just admitted sits near the end
            row = self.queue[index]
            if row.pk == job.pk:
                return None if row.held else index + 1 - (self.held_count() - held_after)
            held_after += row.held
        return None

    def held_count(self) -> int:
        if self._held is None or self._held[0] != len(self.queue):
            self._held = (len(self.queue), sum(row.held for row in self.queue))
        return self._held[1]

    def _replay(self, pool: str) -> _Pool:
        """The pool's replay (apps/scheduling/core/estimate.py) from the head of the queue, in
        seconds from `now`; its last TRAIL jobs make its trail (no dearer: timed at 1,000
        queued)."""
        capacity = self.capacity.get(pool, 0) if pool != ANY else sum(self.capacity.values())
        held = [
            ((end - self.now).total_seconds(), n)
            for sku, end, n in self.running
            if pool in (ANY, sku)
        ]
        replay = _Pool(Replay.start(0.0, capacity, held))
        waiting = [job for job in self.queue if job.sku == pool and not job.held]
        head = max(len(waiting) - TRAIL, 0)
        starts = replay.state.starts(self._waiting(job) for job in waiting[:head])
        replay.starts = {pk: self.now + timedelta(seconds=offset) for pk, offset in starts}
        self._go_on(replay, waiting[head:])
        return replay

    def _go_back(self, pool: str, replay: _Pool, arrived: list[Queued]) -> _Pool:
        """`replay` with the pool's `arrived` jobs (in queue order) in their places."""
        trail = replay.trail
        after = bisect.bisect_right(trail, arrived[0].order, key=lambda step: step[0].order)
        if after == len(trail):  # all after the pool's last job: go on from the end
            self._go_on(replay, arrived)
            return replay
        if after == 0:  # before the trail: the jobs ahead of it are not in it
            return self._replay(pool)
        mark = after
        while (state := trail[mark][1]) is None:
            mark -= 1
        # Python's sort is stable: a job already replayed stays ahead of an arrival that sorts
        # equal to it, as bisect.insort placed the arrival in the queue (extend).
        again = sorted([job for job, _ in trail[mark:]] + arrived, key=lambda r: r.order)
        for job, _ in trail[mark:]:
            replay.starts.pop(job.pk, None)  # given again below, unless it gets none now
        # The mark: a copy taken before trail[mark]'s job, no longer the trail's once dropped.
        replay.state = state
        del trail[mark:]
        replay.unmarked = next(
            (n for n, (_, copy) in enumerate(reversed(trail)) if copy is not None), 0
        )
        self._go_on(replay, again)
        return replay

    def _go_on(self, replay: _Pool, jobs: list[Queued]) -> None:
        """Replay `jobs` (queued after the pool's last one so far) from the replay's end, adding
        them to its trail."""
        state, trail = replay.state, replay.trail
        for job in jobs:
            if not trail or replay.unmarked >= MARK_EVERY - 1:
                trail.append((job, state.copy()))
                replay.unmarked = 0
            else:
                trail.append((job, None))
                replay.unmarked += 1
            for pk, offset in state.starts((self._waiting(job),)):
                replay.starts[pk] = self.now + timedelta(seconds=offset)
        if len(trail) > TRAIL + MARK_EVERY:  # drop the oldest; the trail starts at a mark
            marks = (n for n in range(len(trail) - TRAIL, len(trail)) if trail[n][1] is not None)
            del trail[: next(marks)]  # one in any MARK_EVERY jobs

    def _waiting(self, job: Queued) -> Waiting:
        return Waiting(job.pk, job.gpus * job.nodes, self.runtime(job))


TRAIL = 64  # a pool's last jobs an arrival can sort among without a replay from the head
MARK_EVERY = 8  # of those, every 8th keeps a copy of the replay as it was before it


class _Pool:
    """A pool's replay: the estimated starts, the replay after the pool's last job, and its
    trail: the pool's last jobs in queue order, each with a copy of the replay before it every
    MARK_EVERY jobs and on the first (else None). A job that arrives sorting among them is
    replayed from the mark before it with the jobs after it, not from the head of the queue."""

    __slots__ = ("starts", "state", "trail", "unmarked")

    def __init__(self, state: Replay):
        self.starts: dict = {}
        self.state = state
        self.trail: list[tuple[Queued, Replay | None]] = []
        self.unmarked = 0  # jobs at the end of the trail after its last mark


# --- the 201 answer of a submit -------------------------------------------------------------------

REUSE_SECONDS = 1.0  # how old a web process's loaded replay may be when it answers a submit
ARRIVAL_SLACK = timedelta(
    seconds=0.1
)  # created_at is taken just before the commit; a later one is caught by the count (and reloads)


class QueueCounts:
    """A long queue's jobs per tier, as a web process counted them (at most once a second)."""

    def __init__(self):
        self.loaded_at = time.monotonic()
        self.tiers = rows.tiers()  # {id: (level, rank)}
        found = rows.queued_by_tier()
        self.counts = {tier: n for tier, n, _ in found}
        self.newest = max((newest for _, _, newest in found), default=None)

    def around(self, job: Job) -> tuple[int, int]:
        """(jobs queued, jobs ahead of `job`): the counts plus the jobs queued since; jobs that
        left the queue since the counts were taken still count."""
        since = rows.queued_since(self.newest, job.created_at)
        if any(tier not in self.tiers for tier in since):
            self.tiers = rows.tiers()
        mine = tier_key(*self.tiers.get(job.tier_id, (job.tier.level, job.tier.rank)))
        total = ahead = 0
        for tier in set(self.counts) | set(since):
            counted, (new, new_before) = self.counts.get(tier, 0), since.get(tier, (0, 0))
            total += counted + new
            theirs = (
                tier_key(*self.tiers[tier])
                if tier in self.tiers
                else mine
                if tier == job.tier_id
                else None
            )
            if theirs is None:
                continue
            if theirs < mine:
                ahead += counted + new
            elif theirs == mine:  # the same place in the order: those submitted earlier
                ahead += counted + new_before
        return total, ahead


class _Shared:
    """The process's last replay, shared by its web threads. Everything about it happens under
    `lock`, the read of the queue since it included: the snapshots it is extended with are then
    taken one after another, so a job of the replay missing from a later snapshot has left the
    queue (a thread with a snapshot older than the replay's newest rows could not tell)."""

    estimator: Estimator | None = None
    loaded_at: float = 0.0
    lock = threading.Lock()


_shared = _Shared
FAR_FUTURE = datetime(9999, 1, 1, tzinfo=UTC)


class _Long:
    """While the queue is longer than QUEUE_LIMIT: its counts, shared by the process's threads
    (read-only once loaded; the thread that finds them stale loads them again)."""

    counts: QueueCounts | None = None
    lock = threading.Lock()

    @classmethod
    def fresh(cls) -> QueueCounts | None:
        counts = cls.counts
        if counts is not None and time.monotonic() - counts.loaded_at > REUSE_SECONDS:
            with cls.lock:
                if cls.counts is counts:  # nobody loaded them meanwhile
                    cls.counts = QueueCounts()
                counts = cls.counts
        return counts


_long = _Long


def for_new_job(job: Job) -> tuple[int | None, datetime | None]:
    """`queue_position` and `estimated_start_at` of a job this request just admitted.

    A full `Estimator.load` reads the whole queue (up to QUEUE_LIMIT rows) and the running
    attempts, which made it most of a submit's cost. Here each web process keeps its last load
    for up to REUSE_SECONDS and extends it with the jobs queued since (one statement gives
    them and the length of the queue from the tenants' kept counts, in one snapshot), which also checks that no
    job has left the queue meanwhile (placed or cancelled: then it loads again). Within those seconds, GPUs
    freed by jobs ending and capacity changes are not seen by this answer; a GET of the job
    computes everything afresh.

    Past QUEUE_LIMIT queued jobs, counting the queue for every answer grew with it (~0.13 us
    per queued job and count on SQLite, so ~1.5 ms at 6,000). There each web process counts the
    queue per tier at most every REUSE_SECONDS and adds the jobs queued since (an index range
    from the newest one counted): the position of a job behind QUEUE_LIMIT others is then
    exact but for the jobs that left the queue within that second, which still count as ahead
    (a GET is exact). A job that lands within QUEUE_LIMIT of the head is answered exactly."""
    if job.state != JobState.QUEUED or job.held_by_dependencies:
        return None, None
    counts = _long.fresh()
    if counts is not None:
        total, ahead = counts.around(job)
        if total <= QUEUE_LIMIT:
            _long.counts = None  # short again: answered exactly below
        elif ahead + 1 > QUEUE_LIMIT:
            return ahead + 1, None
    return _exactly(job)


def _exactly(job: Job) -> tuple[int | None, datetime | None]:
    with _shared.lock:
        cached = _shared.estimator
        if (
            cached is None
            or not cached.queue
            or time.monotonic() - _shared.loaded_at > REUSE_SECONDS
        ):
            cached = None
        since = cached.newest() - ARRIVAL_SLACK if cached is not None else FAR_FUTURE
        seen = cached.window_ids if cached is not None else {}
        found, total, window_ids = rows.queue_window(
            since, seen
        )  # one statement: one snapshot of the queue
        short = total <= QUEUE_LIMIT
        if short and cached is not None:
            known = cached.index()
            # (The jobs of the last window are in the replay already: rows.queue_window leaves them out.)
            arrived = [queued_row(*row) for row in found if row[0] not in known]
            # No job of the replay left the queue: the replay and the arrivals are all of it.
            if len(known) + len(arrived) == total:
                cached.extend(arrived)
                cached.window_ids = window_ids
                position = cached.position(job)
                if position is not None:
                    return position, _not_past(cached.estimate(job))
        if short:
            estimator = Estimator.load()
            _shared.estimator, _shared.loaded_at = estimator, time.monotonic()
            return estimator.position(job), estimator.estimate(job)
    # A truncated replay cannot be extended; usually the job is past it.
    if _long.counts is None:
        _long.counts = QueueCounts()
    _, ahead = rows.queued_and_ahead(job)  # one pass over an index, no job row read
    position = ahead + 1
    if position > QUEUE_LIMIT:
        return position, None
    return position, Estimator.load().estimate(job)


def _not_past(moment: datetime | None) -> datetime | None:
    # A reused replay started at its load time: a job that could start at once starts now.
    return max(moment, timezone.now()) if moment is not None else None


def forget() -> None:
    """Drop the process's reused replay, queue counts and nodes' shapes (tests)."""
    _shared.estimator = None
    _long.counts = None
    fit.forget()


def _capacity() -> dict[str, int]:
    rows = Gpu.objects.filter(node__state=NodeState.READY, health=GpuHealth.HEALTHY)
    return dict(rows.values_list("node__sku__name").annotate(n=Count("pk")))


def _runtime(job: Queued | Job, typical: dict[int, float]) -> float:
    usual = typical.get(job.template_id) if job.template_id else None
    return min(job.max_runtime_seconds, usual) if usual else float(job.max_runtime_seconds)


def _held() -> list[tuple[JobAttempt, dict[str, int]]]:
    """Every attempt holding GPUs, with how many per SKU."""
    held: defaultdict[int, defaultdict[str, int]] = defaultdict(lambda: defaultdict(int))
    for attempt_id, sku in GpuAllocation.objects.filter(released_at=None).values_list(
        "attempt_id", "gpu__node__sku__name"
    ):
        held[attempt_id][sku] += 1
    attempts = JobAttempt.objects.filter(pk__in=list(held)).select_related("job")
    return [(attempt, dict(held[attempt.pk])) for attempt in attempts]


def _typical_runtimes(template_ids: set[int]) -> dict[int, float]:
    typical = {}
    for template_id in template_ids:
        rows = (
            JobAttempt.objects.filter(
                job__template_id=template_id,
                state=AttemptState.SUCCEEDED,
                started_at__isnull=False,
                ended_at__isnull=False,
            )  # fmt: skip
            .order_by("-ended_at")
            .values_list("started_at", "ended_at")[:50]
        )
        durations = [(end - start).total_seconds() for start, end in rows if start and end]
        if len(durations) >= 3:
            typical[template_id] = statistics.median(durations)
    return typical
