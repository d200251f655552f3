"""The scheduling policy: which queued job starts, where, what waits, and what gets preempted.

Plain data in, plain data out; no Django. The dispatcher and the simulator run this same code.

The seam the dispatcher calls once per tick::

    decisions = decide(
        now,                       # seconds (any epoch, the same clock as the times below)
        cluster,                   # ClusterManager holding every node and every running pod
        queued=[QueuedJob(...)],   # jobs waiting (a preempted job comes back with its first submit)
        running=[RunningJob(...)], # jobs holding GPUs (starting, running, preempting)
        tiers={"enterprise": TierPolicy(...), ...},
        tenant_usage={"acme": TenantUsage(tier="pro", gpu_seconds=...)},  # decayed, as of now
        config=PolicyConfig(),
        held_reservation=["job-17"],  # the job_ids of the last pass's Reserve decisions
    )

It returns, in the order they were taken:

- `Start(job_id, placement, reason)`: run the job on `placement` now.
- `Preempt(victim_ids, for_job_id, reason, cost_gpu_s)`: signal the victims to checkpoint and
  stop within the grace period. They keep their GPUs until they stop (pass them as running with
  `preempted_for=for_job_id` and `est_end` = signal + grace); `for_job_id` stays queued and holds
  the reservation, and a later pass starts it once the GPUs are free. It was checked (a dry run
  against the placement core) that it fits once the victims are gone.
- `Reserve(job_id, nodes, at, reason)`: the first blocked job holds these nodes from `at` on
  (EASY backfill; `config.reservations` > 1 gives that many blocked jobs one each); pass the
  ids back as `held_reservation` next tick so the holds are kept.
- `Wait(job_id, reason)`: still queued, with the reason shown to the user (only with `explain`).

`decide` places the started jobs in `cluster` (victims stay until they stop), so a dispatcher
should build a fresh ClusterManager per tick. GPUs the cluster holds for pods that are not in
`running`, on cordoned nodes, or unhealthy count as busy. The simulator keeps one `Scheduler`
alive instead and feeds it events (`submit`, `finish`); both go through `Scheduler.decide`.

The rules (docs/scheduling.md has the formulas):

- strict priority between levels; inside a level, weighted fair share of GPUs between tiers (tiers
  under their guaranteed share first) and between tenants by usage decaying with `half_life_s`;
  submit order inside a tenant;
- aging: a job that has waited its tier's `age_limit_s` goes ahead of every non-aged job of its
  level, oldest first;
- a tier never holds more than guaranteed + borrowing limit;
- EASY backfill: the first blocked job gets a reservation on the nodes that free up first (from
  running jobs' estimated ends); later jobs start only if they end by then or leave those GPUs;
- preemption: a job may preempt preemptible jobs of a lower level, or, when its tier is under its
  guarantee, of a same-level tier over its guarantee; victims must have run `min_runtime_s` and been
  preempted fewer than `max_preemptions` times; the cheapest set (GPU-time since last checkpoint
  plus restart cost) is chosen, and nothing is preempted unless the job then really fits.
"""

from __future__ import annotations

import math
from bisect import bisect_left, insort
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from apps.scheduling.core.policy_capacity import (
    FreeView,
    Reservation,
    earliest_fit,
    fits_around,
    pick_reserved,
)
from apps.scheduling.core.policy_order import QueueIndex, SlurmPriority
from apps.scheduling.core.policy_preempt import plan_victims

LN2 = math.log(2.0)
HOUR = 3600.0


# --- settings ---------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class TierPolicy:
    """How one tier is scheduled (from the Tier record; a Quota may override per tenant later)."""

    name: str
    level: int = 0  # strict priority: a higher level always goes first
    weight: float = 1.0  # share of GPUs against other tiers of the same level
    preemptible: bool = False  # its jobs may be preempted
    can_preempt: bool = False  # its jobs may preempt others
    guaranteed_share: float = 0.0  # fraction of the cluster's GPUs it may reclaim by preemption
    borrowing_limit: float | None = None  # fraction above the guarantee it may hold; None: any
    age_limit_s: float = 24 * HOUR  # waiting this long puts a job ahead of its level
    min_runtime_s: float = 15 * 60  # a victim must have run this long in its current attempt
    max_preemptions: int = 3  # a job is preempted at most this many times
    preempt_wait_s: float = 0.0  # wait instead of preempting when a fitting node arrives this soon
    qos_priority: int = 0  # Slurm rendering only: the QOS priority of this tier


@dataclass(frozen=True, slots=True)
class PolicyConfig:
    ordering: str = "fair"  # fair | level-fifo | fifo | slurm
    backfill: bool = True  # EASY backfill behind the first blocked job
    preemption: bool = True
    victim_cost: str = "checkpoint"  # checkpoint | youngest (Slurm-like: ignores checkpoints)
    half_life_s: float = 72 * HOUR  # decay of tenant and tier usage
    backfill_depth: int = 256  # jobs looked at per pass (Slurm's bf_max_job_test)
    grace_s: float = 0.0  # a victim releases its GPUs this long after the signal
    preempt_plans_per_pass: int = 4
    preempt_retry_s: float = 60.0  # a job whose plan failed is not replanned before this
    reservations: int = 1  # blocked jobs that hold a reservation at once (1: EASY backfill)
    # Fair share inside a tier (`fair` ordering): aging lifts the jobs of tenants below their
    # max-min share of the tier after A_T, the others' after `aging_above_share` x A_T; and a
    # tenant below its share may preempt (reclaim) a preemptible job of a tenant of its tier
    # that stays at or above its share afterwards.
    aging_within_share: bool = False
    aging_above_share: float = 2.0  # ...a tenant at or above its share ages after this x A_T
    tenant_reclaim: bool = False
    reclaim_min_runtime_s: float = 3600.0  # a reclaim victim has run at least this long
    reclaim_after_s: float = 0.0  # a job reclaims only after waiting this long
    sticky_reservations: bool = True  # a reservation stays with its job until it starts
    backfill_misses: int = 48  # stop a pass after this many jobs in a row could not start
    full_pass_every_s: float = 300.0  # arrivals alone trigger a pass over the arrivals only
    slurm_weights: tuple[float, float, float] = (100000.0, 10000.0, 1000.0)  # QOS, FS, age
    slurm_max_age_s: float = 7 * 24 * HOUR
    slurm_calc_period_s: float = 300.0


# `fair-reclaim` (opt-in; docs/scheduling.md): `fair` plus fair share inside each tier.
FAIR_RECLAIM: dict[str, Any] = {
    "aging_within_share": True,
    "tenant_reclaim": True,
    "reclaim_after_s": 1800.0,
}


def default_tiers() -> dict[str, TierPolicy]:
    """The platform's default tiers (API.md): enterprise on top and never preempted, free preemptible."""
    return {
        "enterprise": TierPolicy(
            "enterprise", level=2, weight=1.0, can_preempt=True, age_limit_s=1 * HOUR,
            qos_priority=1000,
        ),
        "pro": TierPolicy(
            "pro", level=1, weight=3.0, can_preempt=True, guaranteed_share=0.3,
            age_limit_s=24 * HOUR, qos_priority=100,
        ),
        "free": TierPolicy(
            "free", level=1, weight=1.0, preemptible=True, guaranteed_share=0.1,
            age_limit_s=48 * HOUR, min_runtime_s=10 * 60, qos_priority=10,
        ),
    }  # fmt: skip


# --- the data the dispatcher passes -------------------------------------------------------------


@dataclass(slots=True)
class QueuedJob:
    job_id: str
    tenant: str
    tier: str
    gpus: int  # GPUs per node
    submit: float  # the first submit time; a preempted job keeps it
    est_runtime_s: float  # max_runtime_seconds, or a better estimate (remaining work + restart)
    nodes: int = 1  # > 1: a gang, all or nothing
    gpu_models: tuple[str, ...] = ()
    node_selector: Mapping[str, str] = field(default_factory=dict)
    tolerations: tuple[str, ...] = ()
    preemptions: int = 0  # how often it was preempted so far
    checkpoint_interval_s: float = 0.0  # it saves progress this often (0: never, or unknown)
    restart_cost_s: float = 0.0  # a restart spends this long before making progress
    seq: int = -1  # tie-break among equal submits; the policy fills it in when left at -1


@dataclass(slots=True)
class RunningJob:
    job_id: str
    tenant: str
    tier: str
    gpus: int
    started_at: float  # start of the current attempt
    est_end: float  # when it is expected to release its GPUs
    placement: Any  # the Placement it holds
    nodes: int = 1
    last_checkpoint_at: float | None = None  # None: nothing saved in this attempt
    restart_cost_s: float = 0.0  # time a restart spends before making progress again
    checkpoint_interval_s: float = 0.0  # periodic saves from `progress_from` on (0: none)
    progress_from: float | None = None  # when this attempt starts making progress
    preemptions: int = 0
    gpu_models: tuple[str, ...] = ()
    node_selector: Mapping[str, str] = field(default_factory=dict)
    tolerations: tuple[str, ...] = ()
    preempted_for: str | None = None  # signalled to stop for this job; holds GPUs until it does
    alloc: list[tuple[str, int]] = field(default_factory=list)  # filled from placement


@dataclass(frozen=True, slots=True)
class ArrivingNode:
    """A node being provisioned: ready at `ready_at` with `gpus` GPUs of `gpu_model`."""

    ready_at: float
    gpu_model: str
    gpus: int


@dataclass(frozen=True, slots=True)
class TenantUsage:
    tier: str
    gpu_seconds: float  # GPU-seconds used, each decayed by 2^(-age/half_life), as of `now`


# --- decisions ----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Start:
    job_id: str
    placement: Any
    reason: str


@dataclass(frozen=True, slots=True)
class Preempt:
    victim_ids: tuple[str, ...]
    for_job_id: str
    reason: str
    cost_gpu_s: float


@dataclass(frozen=True, slots=True)
class Reserve:
    job_id: str
    nodes: tuple[str, ...]
    at: float
    reason: str


@dataclass(frozen=True, slots=True)
class Wait:
    job_id: str
    reason: str


Decision = Start | Preempt | Reserve | Wait


# --- the stateless seam -------------------------------------------------------------------------


def decide(
    now: float,
    cluster: Any,
    queued: Iterable[QueuedJob],
    running: Iterable[RunningJob],
    tiers: Mapping[str, TierPolicy],
    tenant_usage: Mapping[str, TenantUsage] | None = None,
    *,
    config: PolicyConfig | None = None,
    held_reservation: str | Iterable[str] | None = None,
    tenant_weights: Mapping[str, float] | None = None,
    explain: bool = True,
    arriving: Iterable[ArrivingNode] = (),
) -> list[Decision]:
    """One scheduling pass over state rebuilt from plain data (see the module docstring).

    `arriving`: nodes being provisioned; a job whose tier has `preempt_wait_s` waits for them
    instead of preempting when enough fitting ones arrive within that time."""
    scheduler = Scheduler(cluster, tiers, config, tenant_weights=tenant_weights)
    for node in cluster.list_nodes():
        scheduler.add_node(node, in_cluster=True)
    for job in running:
        scheduler.restore_running(job)
    _busy_beyond_running(scheduler, cluster)
    scheduler.reset_usage(now)
    for tenant, usage in (tenant_usage or {}).items():
        scheduler.set_usage(tenant, usage.tier, usage.gpu_seconds, now)
    for job in queued:
        scheduler.submit(job)
    scheduler.hold(held_reservation)
    scheduler.arriving = list(arriving)
    return scheduler.decide(now, explain=explain)


def _busy_beyond_running(scheduler: Scheduler, cluster: Any) -> None:
    """Count as busy what the cluster cannot give: other pods, cordoned nodes, unhealthy GPUs."""
    if not hasattr(cluster, "node_view"):
        return
    view = scheduler.view
    for name in list(view.free):
        node = cluster.node_view(name)
        usable = 0
        if not node.cordoned:
            usable = sum(
                1 for m, ok in zip(node.free_milli, node.healthy, strict=True) if m >= 1000 and ok
            )
        if view.free[name] > usable:
            view.take(name, view.free[name] - usable)


def decayed_gpu_seconds(
    runs: Iterable[tuple[float, float, int]], now: float, half_life_s: float
) -> float:
    """Decayed usage from `(start, end, gpus)` runs: sum of gpus * integral of 2^(-(now-t)/H) dt."""
    total = 0.0
    for start, end, gpus in runs:
        end = min(end, now)
        if end > start:
            k = LN2 / half_life_s
            total += gpus * (math.exp(-k * (now - end)) - math.exp(-k * (now - start))) / k
    return total


# --- the engine -----------------------------------------------------------------------------------


class _Usage:
    """Decayed GPU-seconds, advanced lazily. `gpus(now)` is the standing in GPUs."""

    __slots__ = ("decayed", "at", "running")

    def __init__(self) -> None:
        self.decayed = 0.0
        self.at = 0.0
        self.running = 0

    def value(self, now: float, half_life: float) -> float:
        if now <= self.at:
            return self.decayed
        decay = math.exp(-LN2 * (now - self.at) / half_life)
        return self.decayed * decay + self.running * half_life / LN2 * (1.0 - decay)

    def change(self, now: float, half_life: float, delta: int) -> None:
        self.decayed = self.value(now, half_life)
        self.at = max(self.at, now)
        self.running += delta

    def gpus(self, now: float, half_life: float) -> float:
        """Running GPUs plus the decayed average of past GPUs (the same unit)."""
        return self.running + self.value(now, half_life) * LN2 / half_life


class Scheduler:
    """The policy with its incremental state (queue, free GPUs, usage, held reservation).

    Every method is O(1) or O(log n) except `decide`, whose cost is bounded by
    `backfill_depth` jobs looked at, each costing O(log Q) to order plus, when it may fit, one
    placement call.
    """

    def __init__(
        self,
        cluster: Any,
        tiers: Mapping[str, TierPolicy],
        config: PolicyConfig | None = None,
        *,
        pod_type: Any = None,
        tenant_weights: Mapping[str, float] | None = None,
    ) -> None:
        self.cluster = cluster
        self.tiers = dict(tiers)
        self.config = config or PolicyConfig()
        if self.config.ordering not in ("fair", "level-fifo", "fifo", "slurm"):
            raise ValueError(f"unknown ordering {self.config.ordering!r}")
        self._pod_type = pod_type
        self.tenant_weights = dict(tenant_weights or {})
        self.view = FreeView()
        self.queued: dict[str, QueuedJob] = {}
        self.running: dict[str, RunningJob] = {}
        self.index = QueueIndex(lambda tier: self.tiers[tier].level)
        self._ends: list[tuple[float, int, str]] = []  # running jobs by estimated end
        self._end_key: dict[str, tuple[float, int, str]] = {}
        self._seq = 0
        self._tenant_usage: dict[str, _Usage] = {}
        self._tenant_tier: dict[str, str] = {}
        self._running_of: dict[str, dict[str, RunningJob]] = {}  # tenant -> its running jobs
        self._tier_usage: dict[str, _Usage] = {t: _Usage() for t in self.tiers}
        self._preemptible_running = 0
        self._held: list[str] = []  # jobs holding reservations, in the order they got them
        self._resvs: dict[str, Reservation] = {}  # their reservations from the last pass
        self._resv_dirty = True
        self._changed = True  # anything but arrivals since the last full pass
        self._arrived: list[QueuedJob] = []  # arrivals since the last pass
        self._last_full = -math.inf
        self.wake_at = math.inf  # call `decide` again by then: a time-based change is due
        self._plan_failed: dict[str, float] = {}
        self._reclaim_failed: dict[str, float] = {}  # tier -> no reclaim plan before this
        self._victims_of: dict[str, set[str]] = {}  # preemptor -> victims still stopping
        self.arriving: list[ArrivingNode] = []  # nodes being provisioned (autoscaler)
        self._slurm = SlurmPriority(self.config.slurm_calc_period_s)
        self._draining: set[str] = set()  # nodes that take no new work (see drain_node)
        self.now = 0.0

    # --- state changes --------------------------------------------------------------------

    def add_node(self, node: Any, *, in_cluster: bool = False) -> None:
        """Register a node (and add it to the cluster unless it is already there)."""
        if not in_cluster:
            self.cluster.add_node(node)
        self.view.add_node(node.name, int(node.gpus), node.gpu_model)
        self._resv_dirty = self._changed = True

    def drain_node(self, name: str) -> None:
        """No new work on the node (cordoned); its running jobs stay until they end. O(G + log N).

        Its free GPUs leave the view now and GPUs its jobs release never come back to it, so the
        pass neither places nor reserves anything there."""
        if name in self._draining:
            return
        self._draining.add(name)
        if hasattr(self.cluster, "cordon"):
            self.cluster.cordon(name)
        free = self.view.free.get(name, 0)
        if free:
            self.view.take(name, free)
        self._resv_dirty = self._changed = True

    def remove_node(self, name: str) -> None:
        """Forget a node that runs nothing (the autoscaler gives back idle nodes only).

        Raises ValueError when a running job still holds GPUs there. O(R + G + log N) for R
        running jobs."""
        busy = [j.job_id for j in self.running.values() if any(n == name for n, _ in j.alloc)]
        if busy:
            raise ValueError(f"node {name} still runs {', '.join(sorted(busy))}")
        self.cluster.remove_node(name)
        self.view.remove_node(name)
        self._draining.discard(name)
        self._resv_dirty = self._changed = True

    def submit(self, job: QueuedJob) -> None:
        """O(log n). The job joins the queue (a preempted job comes back through here too)."""
        if job.job_id in self.queued or job.job_id in self.running:
            raise ValueError(f"job {job.job_id} is already known")
        if job.tier not in self.tiers:
            raise KeyError(f"job {job.job_id}: unknown tier {job.tier!r}")
        if job.seq < 0:
            self._seq += 1
            job.seq = self._seq
        self.queued[job.job_id] = job
        self._tenant_tier[job.tenant] = job.tier
        self.index.add(job.tier, job.tenant, job.submit, job.seq, job)
        self._arrived.append(job)
        if self.config.ordering == "slurm":
            self._slurm.add(job, self._slurm_priority(job))

    def cancel(self, job_id: str) -> None:
        """Drop a queued job."""
        job = self.queued.pop(job_id)
        self.index.remove(job.tier, job.tenant, job.submit, job.seq)
        self._changed = True
        if job_id in self._held:
            self.hold([j for j in self._held if j != job_id])

    def hold(self, job_ids: Iterable[str] | str | None) -> None:
        """The jobs that keep their reservations from an earlier pass (sticky heads)."""
        if isinstance(job_ids, str):
            job_ids = [job_ids]
        self._held = list(job_ids or ())
        self._resv_dirty = self._changed = True

    def reset_usage(self, now: float) -> None:
        """Forget decayed history (running GPUs stay); `set_usage` then seeds it per tenant."""
        for usage in (*self._tenant_usage.values(), *self._tier_usage.values()):
            usage.decayed, usage.at = 0.0, now

    def set_usage(self, tenant: str, tier: str, gpu_seconds: float, now: float) -> None:
        """Seed a tenant's decayed usage (the dispatcher computes it from attempt history)."""
        self._changed = True
        usage = self._usage_of(tenant)
        usage.decayed, usage.at = gpu_seconds, now
        tier_usage = self._tier_usage.setdefault(tier, _Usage())
        tier_usage.decayed = tier_usage.value(now, self.config.half_life_s) + gpu_seconds
        tier_usage.at = max(tier_usage.at, now)

    def restore_running(self, job: RunningJob) -> None:
        """A job that already holds its placement in the cluster."""
        self._changed = True
        self._add_running(job, job.started_at)

    def finish(self, job_id: str, now: float) -> RunningJob:
        """The job released its GPUs (finished, failed, cancelled or stopped after preemption)."""
        job = self._remove_running(job_id, now)
        self.cluster.remove_pod(job_id)
        self._changed = True
        if self._resv_dirty:
            return job
        for resv in self._resvs.values():
            if job.est_end <= resv.shadow:
                for node, n in job.alloc:
                    if node in resv.need:
                        resv.released[node] = max(0, resv.released.get(node, 0) - n)
            else:
                self._resv_dirty = True  # it ended early: a reservation may come sooner
        return job

    def _signal(self, victim: RunningJob, for_job: str, release: float) -> None:
        """The victim stops by `release`; until then it keeps its GPUs."""
        key = self._end_key.pop(victim.job_id)
        del self._ends[bisect_left(self._ends, key)]
        victim.est_end = min(victim.est_end, release)
        victim.preempted_for = for_job
        self._seq += 1
        key = (victim.est_end, self._seq, victim.job_id)
        insort(self._ends, key)
        self._end_key[victim.job_id] = key
        self._victims_of.setdefault(for_job, set()).add(victim.job_id)
        self._resv_dirty = True

    def record_checkpoint(self, job_id: str, at: float) -> None:
        self.running[job_id].last_checkpoint_at = at

    # --- the pass ---------------------------------------------------------------------------

    def decide(self, now: float, *, explain: bool = False) -> list[Decision]:
        """One pass: start, preempt for, reserve for, or explain the queued jobs in order.

        When only arrivals happened since the last full pass (no finish, cancel or node change,
        and less than `full_pass_every_s` ago), the jobs ahead of them were already found not to
        fit, so the pass looks at the arrivals only, unless one of them could preempt or outranks
        every reservation holder.
        """
        self.now = now
        if now >= self.wake_at:
            self._changed = True
        self.wake_at = math.inf
        arrived, self._arrived = self._arrived, []
        quick = (
            not explain
            and not self._changed
            and now - self._last_full < self.config.full_pass_every_s
            and not any(self._urgent(job) for job in arrived)
        )
        if quick:
            live = [j for j in arrived if self.queued.get(j.job_id) is j]
            return _Pass(self, now, explain, order=iter(live)).run()
        self._changed = False
        self._last_full = now
        return _Pass(self, now, explain).run()

    def _urgent(self, job: QueuedJob) -> bool:
        """Whether an arrival needs a full pass: it may preempt, or outranks the held jobs."""
        if self.config.ordering in ("fifo", "slurm"):
            return True
        tier = self.tiers[job.tier]
        if tier.can_preempt and self.config.preemption and self._preemptible_running:
            lowest = min((t.level for t in self.tiers.values() if t.preemptible), default=math.inf)
            guarantee = tier.guaranteed_share * self.view.total
            if tier.level > lowest or self.tier_gpus(tier.name) < guarantee:
                return True
        levels = [self.tiers[self.queued[j].tier].level for j in self._held if j in self.queued]
        return not levels or tier.level > min(levels)

    # --- helpers used by the pass -------------------------------------------------------------

    def _usage_of(self, tenant: str) -> _Usage:
        usage = self._tenant_usage.get(tenant)
        if usage is None:
            usage = self._tenant_usage[tenant] = _Usage()
        return usage

    def _add_running(self, job: RunningJob, now: float) -> None:
        if not job.alloc:
            job.alloc = _alloc_of(job.placement)
        if job.preempted_for is not None:
            self._victims_of.setdefault(job.preempted_for, set()).add(job.job_id)
        for node, n in job.alloc:
            self.view.take(node, n)
        self.running[job.job_id] = job
        self._tenant_tier[job.tenant] = job.tier
        self._running_of.setdefault(job.tenant, {})[job.job_id] = job
        self._seq += 1
        key = (job.est_end, self._seq, job.job_id)
        insort(self._ends, key)
        self._end_key[job.job_id] = key
        gpus = sum(n for _, n in job.alloc)
        half_life = self.config.half_life_s
        self._usage_of(job.tenant).change(now, half_life, gpus)
        self._tier_usage.setdefault(job.tier, _Usage()).change(now, half_life, gpus)
        if self.tiers[job.tier].preemptible:
            self._preemptible_running += 1

    def _remove_running(self, job_id: str, now: float) -> RunningJob:
        job = self.running.pop(job_id)
        del self._running_of[job.tenant][job_id]
        for node, n in job.alloc:
            if node not in self._draining:
                self.view.give(node, n)
        if job.preempted_for is not None:
            pending = self._victims_of.get(job.preempted_for)
            if pending is not None:
                pending.discard(job_id)
                if not pending:
                    del self._victims_of[job.preempted_for]
        key = self._end_key.pop(job_id)
        del self._ends[bisect_left(self._ends, key)]
        gpus = sum(n for _, n in job.alloc)
        half_life = self.config.half_life_s
        self._usage_of(job.tenant).change(now, half_life, -gpus)
        self._tier_usage[job.tier].change(now, half_life, -gpus)
        if self.tiers[job.tier].preemptible:
            self._preemptible_running -= 1
        return job

    def _pod(self, job: QueuedJob | RunningJob) -> Any:
        if self._pod_type is None:
            from apps.scheduling.core import Pod

            self._pod_type = Pod
        return self._pod_type(
            job.job_id,
            gpus=job.gpus,
            nodes=job.nodes,
            gpu_models=tuple(job.gpu_models),
            node_selector=dict(job.node_selector),
            tolerations=tuple(job.tolerations),
        )

    def tier_gpus(self, tier: str) -> int:
        usage = self._tier_usage.get(tier)
        return usage.running if usage else 0

    def tenant_shares(self, tier: str) -> dict[str, tuple[int, float]]:
        """Each tenant of the tier with running or queued work: (running GPUs, its max-min fair
        share of the GPUs the tier holds now, weighted by tenant weight, capped by its demand)."""
        queued = self.index.by_tier.get(tier, {})
        weights = self.tenant_weights
        running: dict[str, int] = {}
        demand: dict[str, float] = {}
        for tenant, t in self._tenant_tier.items():
            if t != tier:
                continue
            usage = self._tenant_usage.get(tenant)
            run = usage.running if usage is not None else 0
            tq = queued.get(tenant)
            want = run + (tq.gpus if tq is not None else 0)
            if want > 0:
                running[tenant] = run
                demand[tenant] = want
        left = float(sum(running.values()))
        shares: dict[str, tuple[int, float]] = {}
        order = sorted(demand, key=lambda t: demand[t] / weights.get(t, 1.0))
        weight_left = sum(weights.get(t, 1.0) for t in order)
        for tenant in order:
            w = weights.get(tenant, 1.0)
            share = min(demand[tenant], left * w / weight_left) if weight_left > 0 else 0.0
            shares[tenant] = (running[tenant], share)
            left -= share
            weight_left -= w
        return shares

    def _tier_cap(self, tier: TierPolicy) -> float:
        if tier.borrowing_limit is None:
            return math.inf
        return (tier.guaranteed_share + tier.borrowing_limit) * self.view.total

    def _order(
        self, now: float, shares: dict[str, dict[str, tuple[int, float]]] | None = None
    ) -> Iterator[QueuedJob]:
        ordering = self.config.ordering
        if ordering == "fifo":
            return self.index.fifo()
        if ordering == "level-fifo":
            return self.index.level_fifo()
        if ordering == "slurm":
            return self._slurm_order(now)
        return self._fair_order(now, {} if shares is None else shares)

    def _fair_order(
        self, now: float, shares: dict[str, dict[str, tuple[int, float]]]
    ) -> Iterator[QueuedJob]:
        half_life = self.config.half_life_s
        total = max(1, self.view.total)
        tiers = self.tiers
        tenant_weights = self.tenant_weights

        def tier_key(tier: str, charged: float) -> tuple[int, float]:
            usage = self._tier_usage.get(tier)
            gpus = (usage.gpus(now, half_life) if usage else 0.0) + charged
            running = (usage.running if usage else 0) + charged
            over = running >= tiers[tier].guaranteed_share * total
            return int(over), gpus / tiers[tier].weight

        def tenant_key(tier: str, tenant: str) -> float:
            usage = self._tenant_usage.get(tenant)
            gpus = usage.gpus(now, half_life) if usage else 0.0
            return gpus / tenant_weights.get(tenant, 1.0)

        age_scale = None
        if self.config.aging_within_share:
            above = self.config.aging_above_share

            def age_scale(tier: str, tenant: str) -> float:
                if tier not in shares:
                    shares[tier] = self.tenant_shares(tier)
                running, share = shares[tier].get(tenant, (0, 0.0))
                return 1.0 if running < share else above

        return self.index.fair(
            now,
            age_limit=lambda tier: tiers[tier].age_limit_s,
            tier_key=tier_key,
            tier_weight=lambda tier: tiers[tier].weight,
            tenant_key=tenant_key,
            tenant_weight=lambda tenant: tenant_weights.get(tenant, 1.0),
            age_scale=age_scale,
        )

    def _slurm_priority(self, job: QueuedJob) -> float:
        w_qos, w_fs, w_age = self.config.slurm_weights
        max_qos = max((t.qos_priority for t in self.tiers.values()), default=0) or 1
        qos = self.tiers[job.tier].qos_priority / max_qos
        half_life = self.config.half_life_s
        total = sum(u.value(self.now, half_life) for u in self._tenant_usage.values())
        weights = self.tenant_weights
        tenants = self._tenant_usage.keys() | {job.tenant}
        share = weights.get(job.tenant, 1.0) / sum(weights.get(t, 1.0) for t in tenants)
        used = self._usage_of(job.tenant).value(self.now, half_life) / total if total > 0 else 0.0
        fair_share = 2.0 ** (-used / share)
        age = min(1.0, max(0.0, self.now - job.submit) / self.config.slurm_max_age_s)
        return w_qos * qos + w_fs * fair_share + w_age * age

    def _slurm_order(self, now: float) -> Iterator[QueuedJob]:
        order = self._slurm.ordered(now, lambda: iter(self.queued.values()), self._slurm_priority)
        queued = self.queued
        for entry in order:
            job = entry[3]
            if queued.get(job.job_id) is job:
                yield job


def last_checkpoint(job: RunningJob, now: float) -> float:
    """When the job last saved its progress (its start if never): the reported time, or the
    latest periodic save when it checkpoints every `checkpoint_interval_s`."""
    saved = job.last_checkpoint_at if job.last_checkpoint_at is not None else job.started_at
    interval = job.checkpoint_interval_s
    if interval > 0:
        origin = job.progress_from if job.progress_from is not None else job.started_at
        if now >= origin + interval:
            saved = max(saved, origin + (now - origin) // interval * interval)
    return saved


def _alloc_of(placement: Any) -> list[tuple[str, int]]:
    return [(a.node, len(a.gpu_indices)) for a in placement.assignments]


def _gpu_label(job: QueuedJob) -> str:
    models = "/".join(job.gpu_models) if job.gpu_models else ""
    return f"{job.gpus} free {models + ' ' if models else ''}GPU{'s' if job.gpus != 1 else ''}"


class _Pass:
    """One `decide` pass. Kept as an object so each step is a small named method.

    `heads` are the reservations in force during the pass: those kept from earlier passes
    (sticky) and those made for blocked jobs in this one, at most `config.reservations`, on
    disjoint nodes. A job must leave intact every reservation of its level or above but its own.
    """

    def __init__(
        self,
        scheduler: Scheduler,
        now: float,
        explain: bool,
        order: Iterator[QueuedJob] | None = None,
    ) -> None:
        self.s = scheduler
        self.now = now
        self.explain = explain
        self.cfg = scheduler.config
        self.order = order
        self.out: list[Decision] = []
        self.taken: list[QueuedJob] = []
        self.invalid = False  # something in this pass moved the reservations
        self.plans_left = self.cfg.preempt_plans_per_pass if self.cfg.preemption else 0
        self.could_preempt: dict[str, bool] = {}
        self._shares: dict[str, dict[str, tuple[int, float]]] = {}  # tenant_shares per tier
        self.reclaimers: dict[str, set[str]] = {}  # reclaim-only tier -> tenants below share
        self.reclaims_left = 1  # reclaim plans left in this pass (reclaim is never urgent)
        self._room: dict[str, float] = {}  # tenant -> GPUs it may still reclaim in this pass
        self.failed: dict[tuple, int] = {}  # (models, reservations) -> fewest GPUs that failed
        self.heads: list[Reservation] = []
        self.head_of: dict[str, Reservation] = {}
        self._binding: dict[int, list[Reservation]] = {}  # level -> heads at or above it
        self._load_heads()

    def _load_heads(self) -> None:
        s = self.s
        fresh = not s._resv_dirty
        if not self.cfg.sticky_reservations:
            return
        for job_id in s._held[: max(1, self.cfg.reservations)]:
            job = s.queued.get(job_id)
            if job is None:
                continue
            cached = s._resvs.get(job_id)
            if fresh and cached is not None and self.now < cached.shadow:
                self._add_head(cached)
            else:
                resv = self._reserve(job)
                if resv is not None:
                    self._add_head(resv)

    def _add_head(self, resv: Reservation) -> None:
        self.heads.append(resv)
        self.head_of[resv.job_id] = resv
        self.failed.clear()
        self._binding.clear()

    def _drop_head(self, job_id: str) -> None:
        resv = self.head_of.pop(job_id, None)
        if resv is not None:
            self.heads.remove(resv)
            self.failed.clear()
            self._binding.clear()

    # --- the loop -------------------------------------------------------------------------

    def run(self) -> list[Decision]:
        s = self.s
        order = self.order if self.order is not None else s._order(self.now, self._shares)
        preemptors_left, reclaimers_left = self._preemptors_queued()
        self._start_held()
        scanned = misses = 0
        early = {job.job_id for job in self.taken}
        for job in order:
            if early and job.job_id in early:
                continue
            scanned += 1
            if scanned > self.cfg.backfill_depth or misses >= self.cfg.backfill_misses:
                self._wait(job, "behind {} jobs in queue order", scanned - 1)
                break
            started = len(self.taken)
            preemptor = self._may_preempt(job)
            if job.tier in self.reclaimers:
                reclaimers_left -= job.tenant in self.reclaimers[job.tier]
            else:
                preemptors_left -= preemptor
            if s.view.free_total == 0 and not preemptor and self.heads:
                # Nothing starts without preemption; stop once no job left could preempt.
                self._wait(job, self._shortage, job)
                misses += 1
                if self.plans_left <= 0 or (
                    preemptors_left <= 0 and (reclaimers_left <= 0 or self.reclaims_left <= 0)
                ):
                    break
                continue
            if not self._step(job):
                break
            misses = 0 if len(self.taken) > started or not self.heads else misses + 1
        if self.explain:
            for job in order:
                self._wait(job, "behind the jobs ahead in queue order")
        self._finish()
        return self.out

    def _start_held(self) -> None:
        """A job holding a reservation starts as soon as it fits: it is first in line (unless
        a job of a higher level is queued: strict priority comes first)."""
        s = self.s
        top = max(
            (lvl for lvl, tiers in s.index.levels.items() if any(s.index.queues(tiers))),
            default=None,
        )
        for resv in list(self.heads):
            job = s.queued.get(resv.job_id)
            if job is None:
                continue
            tier = s.tiers[job.tier]
            if top is not None and tier.level < top and self.cfg.ordering != "fifo":
                continue
            if s.tier_gpus(job.tier) + job.gpus * job.nodes > s._tier_cap(tier):
                continue
            binding = [r for r in self.heads if r is not resv and r.level >= tier.level]
            placement = self._place(job, binding)
            if placement is not None:
                self._drop_head(job.job_id)
                self._started(job, placement, self._start_reason(job, tier, "reserved, now free"))

    def _preemptors_queued(self) -> tuple[int, int]:
        """How many queued jobs could preempt someone right now: by level or guarantee, and
        by tenant reclaim inside their tier."""
        s = self.s
        if self.plans_left <= 0 or s._preemptible_running == 0:
            return 0, 0
        total = s.view.total
        lowest = min((t.level for t in s.tiers.values() if t.preemptible), default=math.inf)
        over = {
            t.name for t in s.tiers.values() if s.tier_gpus(t.name) > t.guaranteed_share * total
        }
        count = reclaim = 0
        for name, tier in s.tiers.items():
            able = tier.can_preempt and (
                tier.level > lowest
                or (
                    s.tier_gpus(name) < tier.guaranteed_share * total
                    and any(
                        s.tiers[o].level == tier.level and s.tiers[o].preemptible
                        for o in over - {name}
                    )
                )
            )
            if not able and self.cfg.tenant_reclaim and tier.preemptible:
                # Reclaim only: the tenants below their share, while some tenant is above.
                shares = self._shares[name] = s.tenant_shares(name)
                if any(run > share for run, share in shares.values()):
                    below = {t for t, (run, share) in shares.items() if run < share}
                    self.reclaimers[name] = below
                    self.could_preempt[name] = bool(below)
                    reclaim += sum(
                        len(tq.items) for tq in s.index.queues([name]) if tq.tenant in below
                    )
                continue
            self.could_preempt[name] = able
            if able:
                count += sum(len(tq.items) for tq in s.index.queues([name]))
        return count, reclaim

    def _step(self, job: QueuedJob) -> bool:
        """Handle one job; False stops the pass (FIFO without backfill: head-of-line blocking)."""
        s = self.s
        tier = s.tiers[job.tier]
        total = job.gpus * job.nodes
        if s.tier_gpus(job.tier) + total > s._tier_cap(tier):
            self._wait(job, self._at_cap, job)
            return True
        if not self.heads:
            return self._front(job, tier)
        level = tier.level
        binding = self._binding.get(level)
        if binding is None:
            binding = self._binding[level] = [r for r in self.heads if r.level >= level]
        if job.job_id in self.head_of:
            binding = [r for r in binding if r.job_id != job.job_id]
        if not binding:
            return self._front(job, tier)
        self._behind(job, tier, binding)
        return True

    def _front(self, job: QueuedJob, tier: TierPolicy) -> bool:
        """Nothing of its standing is reserved ahead of it: start, preempt, or reserve."""
        placement = self._place(job, [])
        if placement is not None:
            if self.heads and job.job_id not in self.head_of:
                self.invalid = True  # it outranks the holders: their reservations may move
            self._drop_head(job.job_id)
            self._started(job, placement, self._start_reason(job, tier, "first in line"))
            return True
        if self._try_preempt(job, tier):
            self.invalid = True  # the victims now end at the signal + grace
            self._drop_head(job.job_id)
            return self._make_head(job, force=True) if self.cfg.backfill else True
        if not self.cfg.backfill:
            self._wait(job, self._shortage, job)
            return False
        return self._make_head(job)

    def _behind(self, job: QueuedJob, tier: TierPolicy, binding: list[Reservation]) -> None:
        """Backfill: start only if it ends before a reservation or leaves its GPUs alone."""
        end = self.now + job.est_runtime_s
        hard = [r for r in binding if end > r.shadow]
        placement = self._place(job, hard)
        if placement is not None:
            soft = [r for r in binding if end <= r.shadow]
            for node, n in _alloc_of(placement):
                for resv in soft:
                    if node in resv.need:
                        resv.released[node] = resv.released.get(node, 0) + n
            self._drop_head(job.job_id)
            self._started(job, placement, self._start_reason(job, tier, "backfilled"))
            return
        # It may preempt too (several top-level jobs at once), but never on reserved nodes.
        if self._may_preempt(job):
            top = max(r.level for r in binding)
            if (
                tier.level > top
                or (tier.level == top and self._above_victims(tier))
                or (self.cfg.tenant_reclaim and tier.preemptible)
            ):
                avoid = {node for r in binding for node in r.need}
                if self._try_preempt(job, tier, avoid):
                    self.invalid = True
                    self._drop_head(job.job_id)
                    self._make_head(job, force=True)
                    return
        if job.job_id in self.head_of or len(self.heads) < self.cfg.reservations:
            self._make_head(job)
            return
        self._wait(job, self._behind_reason, job, hard)

    def _make_head(self, job: QueuedJob, force: bool = False) -> bool:
        """Give a blocked job a reservation (or renew its own); False never stops the pass."""
        resv = self.head_of.get(job.job_id)
        if resv is None:
            if len(self.heads) >= self.cfg.reservations and not force:
                level = self.s.tiers[job.tier].level
                lowest = min(self.heads, key=lambda r: r.level)
                if lowest.level >= level:
                    self._wait(job, self._shortage, job)
                    return True
                self._drop_head(lowest.job_id)  # a higher level takes the reservation over
                self.invalid = True
            resv = self._reserve(job)
            if resv is None:
                self._wait(
                    job,
                    "needs {} node(s) with {}: more than the cluster can offer",
                    job.nodes,
                    _gpu_label(job),
                )
                return True
            self._add_head(resv)
        reason = "reserved"
        if self.explain:
            reason = (
                f"first in line, reserved {len(resv.need)} node(s) from t={resv.shadow:.0f} "
                f"(when running jobs end by their limits); now {self._shortage(job)}"
            )
        self.out.append(Reserve(job.job_id, tuple(sorted(resv.need)), resv.shadow, reason))
        return True

    # --- placing --------------------------------------------------------------------------

    def _place(self, job: QueuedJob, binding: list[Reservation]) -> Any:
        """Place via the placement core, leaving the `binding` reservations intact.

        A shape that failed the count check in this pass fails again without a second look
        (cleared whenever a job starts or a reservation changes).
        """
        s = self.s
        key = (job.gpu_models, tuple([r.job_id for r in binding]))
        fewest = self.failed.get(key)
        if fewest is not None and job.gpus >= fewest:
            return None
        ok = (
            fits_around(s.view, binding, job.gpus, job.nodes, job.gpu_models)
            if binding
            else s.view.fits(job.gpus, job.nodes, job.gpu_models)
        )
        if not ok:
            if job.nodes == 1:
                self.failed[key] = job.gpus if fewest is None else min(fewest, job.gpus)
            return None
        pod = s._pod(job)
        placement = s.cluster.schedule_pod(pod)
        if placement is None or not binding:
            return placement
        cordoned: list[str] = []
        for _ in range(3):
            clash = self._clashes(_alloc_of(placement), binding)
            if not clash:
                break
            # The placement core chose GPUs a reservation needs: undo, steer it away, retry.
            s.cluster.remove_pod(job.job_id)
            placement = None
            for node in clash:
                if not s.cluster.node_view(node).cordoned:
                    s.cluster.cordon(node)
                    cordoned.append(node)
            placement = s.cluster.schedule_pod(pod)
            if placement is None:
                break
        else:
            s.cluster.remove_pod(job.job_id)
            placement = None
        for node in cordoned:
            s.cluster.cordon(node, False)
        if placement is None and job.nodes == 1:
            self.failed[key] = job.gpus if fewest is None else min(fewest, job.gpus)
        return placement

    def _clashes(self, alloc: list[tuple[str, int]], binding: list[Reservation]) -> set[str]:
        """Reserved nodes on which `alloc` would leave a reservation short."""
        view = self.s.view
        for node, n in alloc:
            view.take(node, n)
        clash = {
            node for node, _ in alloc for r in binding if node in r.need and r.extra(view, node) < 0
        }
        for node, n in alloc:
            view.give(node, n)
        return clash

    def _started(self, job: QueuedJob, placement: Any, reason: str) -> None:
        s = self.s
        begin = self.now
        resumed = job.restart_cost_s if job.preemptions else 0.0
        running = RunningJob(
            job.job_id, job.tenant, job.tier, job.gpus, begin, begin + job.est_runtime_s,
            placement, nodes=job.nodes, restart_cost_s=job.restart_cost_s,
            checkpoint_interval_s=job.checkpoint_interval_s, progress_from=begin + resumed,
            preemptions=job.preemptions, gpu_models=job.gpu_models,
            node_selector=job.node_selector, tolerations=job.tolerations,
        )  # fmt: skip
        s._add_running(running, self.now)
        self.taken.append(job)
        self.failed.clear()
        self.out.append(Start(job.job_id, placement, reason))

    def _start_reason(self, job: QueuedJob, tier: TierPolicy, how: str) -> str:
        return f"{how}: {job.nodes} x {job.gpus} GPUs for tier {tier.name}, tenant {job.tenant}"

    # --- reservations -----------------------------------------------------------------------

    def _reserve(self, job: QueuedJob) -> Reservation | None:
        """The earliest time and nodes for `job`, on nodes no other reservation holds."""
        s = self.s
        taken = {node for r in self.heads for node in r.need}
        found = earliest_fit(
            s.view, s._ends, _Allocs(s), job.gpus, job.nodes, job.gpu_models, self.now, taken
        )
        if found is None:
            return None
        shadow, gained = found
        need = pick_reserved(s.view, gained, job.gpus, job.nodes, job.gpu_models, taken)
        released = {node: gained[node] for node in need if node in gained}
        return Reservation(job.job_id, s.tiers[job.tier].level, shadow, need, released)

    # --- preemption -----------------------------------------------------------------------

    def _may_preempt(self, job: QueuedJob) -> bool:
        if self.plans_left <= 0 or not self.could_preempt.get(job.tier, False):
            return False
        reclaimers = self.reclaimers.get(job.tier)
        return reclaimers is None or (self.reclaims_left > 0 and job.tenant in reclaimers)

    def _capacity_coming(self, job: QueuedJob, tier: TierPolicy) -> float | None:
        """When enough arriving nodes that fit the job are ready within the tier's tolerance:
        the time the last of them is ready (then waiting beats preempting); else None."""
        if tier.preempt_wait_s <= 0 or not self.s.arriving:
            return None
        horizon = self.now + tier.preempt_wait_s
        ready = sorted(
            node.ready_at
            for node in self.s.arriving
            if node.ready_at <= horizon
            and node.gpus >= job.gpus
            and (not job.gpu_models or node.gpu_model in job.gpu_models)
        )
        return ready[job.nodes - 1] if len(ready) >= job.nodes else None

    def _try_preempt(
        self, job: QueuedJob, tier: TierPolicy, avoid: set[str] | frozenset[str] = frozenset()
    ) -> bool:
        s = self.s
        if not self._may_preempt(job):
            return False
        if self.now < s._plan_failed.get(job.job_id, -math.inf) or job.job_id in s._victims_of:
            return False  # failed recently, or its victims are still stopping
        reclaimers = self.reclaimers.get(job.tier)
        if reclaimers is not None:  # its tier may only reclaim: one plan a pass, if this job may
            if (
                self.reclaims_left <= 0
                or self.now < s._reclaim_failed.get(job.tier, -math.inf)
                or not self._may_reclaim(job, reclaimers)
            ):
                return False
            self.reclaims_left -= 1
        coming = self._capacity_coming(job, tier)
        if coming is not None:
            s.wake_at = min(s.wake_at, coming)  # look again when it is there
            return False
        self.plans_left -= 1
        pool: Iterable[RunningJob] = s.running.values()
        if reclaimers is not None:  # only the jobs of tenants above their share
            pool = [
                v
                for t in self._tier_shares(job.tier)
                if self._surplus(job.tier, t) > 0
                for v in s._running_of.get(t, {}).values()
            ]
        victims = [
            v
            for v in pool
            if self._victim_ok(job, tier, v) and not (avoid and any(n in avoid for n, _ in v.alloc))
        ]
        plan = None
        if victims:
            allowed = set(s.view.models_for(job.gpu_models))
            free = s.view.free
            if avoid:
                free = {node: f for node, f in free.items() if node not in avoid}
            plan = plan_victims(
                job.gpus, job.nodes, allowed, free, s.view.model, victims, self._cost
            )
        if plan is not None:
            taken: dict[str, int] = {}
            for v in plan[0]:
                if v.tier == job.tier:
                    taken[v.tenant] = taken.get(v.tenant, 0) + v.gpus * v.nodes
            if any(n > self._surplus(job.tier, t) for t, n in taken.items()):
                plan = None  # together the victims would take their tenant below its share
        if plan is None or not self._evict_and_place(job, tier, *plan):
            if reclaimers is not None:  # reclaim is never urgent: the tier waits a while
                s._reclaim_failed[job.tier] = self.now + self.cfg.preempt_retry_s
                return False
            soonest = self._next_eligible()  # a new victim may become eligible then
            s._plan_failed[job.job_id] = min(self.now + self.cfg.preempt_retry_s, soonest)
            s.wake_at = min(s.wake_at, soonest)
            return False
        s._plan_failed.pop(job.job_id, None)
        return True

    def _above_victims(self, tier: TierPolicy) -> bool:
        """Whether the tier outranks some preemptible tier (preemption by level, not reclaim)."""
        lowest = min((t.level for t in self.s.tiers.values() if t.preemptible), default=math.inf)
        return tier.level > lowest

    def _next_eligible(self) -> float:
        """When the next preemptible job passes its minimum runtime (inf if none will)."""
        s = self.s
        soonest = math.inf
        for victim in s.running.values():
            vt = s.tiers[victim.tier]
            if vt.preemptible and victim.preempted_for is None:
                at = victim.started_at + vt.min_runtime_s
                if self.now < at < soonest and victim.preemptions < vt.max_preemptions:
                    soonest = at
        return soonest

    def _victim_ok(self, job: QueuedJob, tier: TierPolicy, victim: RunningJob) -> bool:
        s = self.s
        vt = s.tiers[victim.tier]
        if not vt.preemptible or victim.preemptions >= vt.max_preemptions:
            return False
        if victim.preempted_for is not None:
            return False
        if self.now - victim.started_at < vt.min_runtime_s:
            return False
        if tier.level > vt.level:
            return True
        if vt.name == tier.name:
            return self._reclaim_victim(job, victim, vt)
        if tier.level < vt.level:
            return False
        # Same level: reclaim a guarantee from a tier that is borrowing beyond its own.
        total = s.view.total
        job_gpus = job.gpus * job.nodes
        victim_gpus = victim.gpus * victim.nodes
        pending = sum(
            q.gpus * q.nodes
            for q in map(s.queued.get, s._victims_of)
            if q is not None and q.tier == tier.name
        )
        mine_ok = s.tier_gpus(tier.name) + pending + job_gpus <= tier.guaranteed_share * total
        theirs_over = s.tier_gpus(vt.name) - victim_gpus >= vt.guaranteed_share * total
        return mine_ok and theirs_over

    def _may_reclaim(self, job: QueuedJob, reclaimers: set[str]) -> bool:
        """Before a reclaim plan: the job waited long enough, and with it (and whatever its
        tenant's jobs are already preempting for) its tenant holds no more than its share."""
        if self.now - job.submit < self.cfg.reclaim_after_s or job.tenant not in reclaimers:
            return False
        room = self._room.get(job.tenant)
        if room is None:
            s = self.s
            pending = sum(
                q.gpus * q.nodes
                for q in map(s.queued.get, s._victims_of)
                if q is not None and q.tenant == job.tenant
            )
            share = self._tier_shares(job.tier).get(job.tenant, (0, 0.0))[1]
            room = self._room[job.tenant] = share - s._usage_of(job.tenant).running - pending
        return job.gpus * job.nodes <= room

    def _tier_shares(self, tier: str) -> dict[str, tuple[int, float]]:
        shares = self._shares.get(tier)
        if shares is None:
            shares = self._shares[tier] = self.s.tenant_shares(tier)
        return shares

    def _surplus(self, tier: str, tenant: str) -> float:
        """GPUs the tenant holds now beyond its share of the tier (as of the pass's start)."""
        share = self._tier_shares(tier).get(tenant)
        return self.s._usage_of(tenant).running - share[1] if share is not None else 0.0

    def _reclaim_victim(self, job: QueuedJob, victim: RunningJob, vt: TierPolicy) -> bool:
        """A job of another tenant of the same tier that may be reclaimed: it ran at least
        `reclaim_min_runtime_s`, keeps one preemption for higher tiers, and its tenant stays
        at or above its share without it, so it can never reclaim back (no loop)."""
        return (
            self.cfg.tenant_reclaim
            and victim.tenant != job.tenant
            and victim.preemptions + 1 < vt.max_preemptions
            and self.now - victim.started_at >= self.cfg.reclaim_min_runtime_s
            and victim.gpus * victim.nodes <= self._surplus(job.tier, victim.tenant)
        )

    def _cost(self, victim: RunningJob) -> float:
        gpus = victim.gpus * victim.nodes
        if self.cfg.victim_cost == "youngest":
            return gpus * (self.now - victim.started_at)
        return gpus * (self.now - last_checkpoint(victim, self.now) + victim.restart_cost_s)

    def _evict_and_place(
        self, job: QueuedJob, tier: TierPolicy, victims: list[RunningJob], cost: float
    ) -> bool:
        """Dry run: without the victims, does the job fit? If so, signal them."""
        s = self.s
        for victim in victims:
            s.cluster.remove_pod(victim.job_id)
        placement = s.cluster.schedule_pod(s._pod(job))
        if placement is not None:
            s.cluster.remove_pod(job.job_id)
        for victim in victims:
            s.cluster.add_pod(s._pod(victim), victim.placement)
        if placement is None:  # it would still not fit: preempt nobody
            return False
        release = self.now + self.cfg.grace_s
        for victim in victims:
            s._signal(victim, job.job_id, release)
        ids = tuple(v.job_id for v in victims)
        why = (
            f"preempting {len(ids)} job(s) of lower standing for {job.job_id} "
            f"(tier {tier.name}); lost GPU-time {cost / 3600:.2f} GPU-h"
        )
        self.out.append(Preempt(ids, job.job_id, why, cost))
        return True

    # --- waiting and bookkeeping ------------------------------------------------------------

    def _shortage(self, job: QueuedJob) -> str:
        view = self.s.view
        if job.nodes == 1:
            return f"waiting for {_gpu_label(job)} on one node (most free on a node: {view.largest_free(job.gpu_models)})"
        have = view.nodes_with(job.gpus, job.gpu_models)
        return f"gang of {job.nodes} x {job.gpus}: waiting for {job.nodes} nodes with {_gpu_label(job)} ({have} have them)"

    def _at_cap(self, job: QueuedJob) -> str:
        s = self.s
        cap = int(s._tier_cap(s.tiers[job.tier]))
        return f"tier {job.tier} is at its borrowing limit ({s.tier_gpus(job.tier)} of {cap} GPUs)"

    def _behind_reason(self, job: QueuedJob, hard: list[Reservation]) -> str:
        if not hard:
            return self._shortage(job)
        first = min(hard, key=lambda r: r.shadow)
        holder = self.s.queued.get(first.job_id)
        shape = f"{holder.nodes} x {holder.gpus} GPUs, " if holder else ""
        return (
            f"reserved for a job ahead ({first.job_id}: {shape}from t={first.shadow:.0f}); "
            f"this job would run past it. {self._shortage(job)}"
        )

    def _wait(self, job: QueuedJob, reason: Any, *args: Any) -> None:
        """Explain why a job waits; the reason is only built when explaining (it costs)."""
        if self.explain:
            text = reason(*args) if callable(reason) else reason.format(*args)
            self.out.append(Wait(job.job_id, text))

    def _finish(self) -> None:
        s = self.s
        for job in self.taken:
            del s.queued[job.job_id]
            s.index.remove(job.tier, job.tenant, job.submit, job.seq)
            s._plan_failed.pop(job.job_id, None)
        live = [r for r in self.heads if r.job_id in s.queued]
        s._held = [r.job_id for r in live]
        s._resvs = {r.job_id: r for r in live}
        s._resv_dirty = self.invalid


class _Allocs:
    """A read-only mapping job_id -> alloc over the running jobs, without building a dict."""

    __slots__ = ("s",)

    def __init__(self, scheduler: Scheduler) -> None:
        self.s = scheduler

    def __getitem__(self, job_id: str) -> list[tuple[str, int]]:
        return self.s.running[job_id].alloc
