"""The policy's plain data: tier settings, its configuration, the jobs it is given, the
decisions it returns, and the small pure helpers on them (decayed usage, last checkpoint).

No Django; the dispatcher, the simulator and the policy's own modules all share these types.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from apps.scheduling.core.model import Placement

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
    ordering: str = "fair"  # a name in sort.ORDERINGS: fair | level-fifo | fifo | slurm
    backfill: bool = True  # EASY backfill behind the first blocked job
    preemption: bool = True
    victim_cost: str = "checkpoint"  # victims.VICTIM_COSTS: checkpoint | youngest (Slurm)
    half_life_s: float = 72 * HOUR  # decay of tenant and tier usage
    backfill_depth: int = 256  # jobs looked at per pass and resource pool (bf_max_job_test)
    grace_s: float = 0.0  # a victim releases its GPUs this long after the signal
    preempt_plans_per_pass: int = 4
    preempt_retry_s: float = 60.0  # a job whose plan failed is not replanned before this
    reservations: int = 1  # blocked jobs per resource pool holding a reservation (1: EASY)
    # Fair share inside a tier (`fair` ordering, docs/scheduling.md "The order"): aging is
    # capped at the share: an aged job (waited A_T) of a tenant below its max-min share of its
    # tier goes ahead only while it fits in what that tenant lacks of its share, so a long
    # queue earns its tenant no lane; the level's oldest job past `aging_above_share` x A_T goes
    # first, one job at a time, when no job of the level holds a reservation (the bound);
    # `aging_gangs_at_limit` also lifts every tenant's aged gangs. Off: every aged job goes
    # ahead, oldest first (the order before issue 18). And, opt-in, a tenant below its share may
    # preempt (reclaim) a preemptible job of a tenant of its tier that stays at or above its
    # share afterwards.
    aging_within_share: bool = True
    aging_above_share: float = 3.5  # the overdue job: waited this x A_T, whatever its tenant
    aging_gangs_at_limit: bool = False
    tenant_reclaim: bool = False
    reclaim_min_runtime_s: float = 3600.0  # a reclaim victim has run at least this long
    reclaim_after_s: float = 0.0  # a job reclaims only after waiting this long
    sticky_reservations: bool = True  # a reservation stays with its job until it starts
    backfill_misses: int = 48  # a pool is done for the pass after this many misses in a row
    full_pass_every_s: float = 300.0  # arrivals alone trigger a pass over the arrivals only
    slurm_weights: tuple[float, float, float] = (100000.0, 10000.0, 1000.0)  # QOS, FS, age
    slurm_max_age_s: float = 7 * 24 * HOUR
    slurm_calc_period_s: float = 300.0


# `fair-reclaim` (opt-in; docs/scheduling.md): `fair` plus fair share inside each tier.
FAIR_RECLAIM: dict[str, Any] = {
    "aging_within_share": True,
    "aging_above_share": 2.0,
    "aging_gangs_at_limit": False,
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


# A resource pool: what decides the set of nodes a job may use (GPU models, node selector,
# tolerations). The pass keeps its backfill window and miss count per pool.
Pool = tuple[tuple[str, ...], tuple[tuple[str, str], ...], tuple[str, ...]]


def pool_of(job: QueuedJob) -> Pool:
    selector = job.node_selector
    items = tuple(sorted(selector.items())) if selector else ()
    return (job.gpu_models, items, job.tolerations)


@dataclass(slots=True)
class RunningJob:
    job_id: str
    tenant: str
    tier: str
    gpus: int
    started_at: float  # start of the current attempt
    est_end: float  # when it is expected to release its GPUs
    placement: Placement  # the placement it holds
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
    placement: Placement
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
    # What the job still lacks now (the policy's words; "" without `explain`), so a caller can
    # word the reservation itself. Part of `reason` already, hence not in the repr.
    shortage: str = field(default="", repr=False)


@dataclass(frozen=True, slots=True)
class Wait:
    job_id: str
    reason: str


Decision = Start | Preempt | Reserve | Wait

# tier -> tenant -> (running GPUs, max-min fair share of the tier): computed once per pass.
Shares = dict[str, dict[str, tuple[int, float]]]


def decayed_gpu_seconds(
    runs: Iterable[tuple[float, float, int]], now: float, half_life_s: float
) -> float:
    """Decayed usage from `(start, end, gpus)` runs: sum of gpus * integral of 2^(-(now-t)/H) dt."""
    total = 0.0
    for start, end, gpus in runs:
        total += decayed_run(start, min(end, now), gpus, now, half_life_s)
    return total


def decayed_run(start: float, end: float, gpus: int, now: float, half_life_s: float) -> float:
    """One run's term of `decayed_gpu_seconds`, its end taken as given (one after `now` is not
    cut there: a sum kept at a reference time and scaled later needs it whole)."""
    if end <= start:
        return 0.0
    k = LN2 / half_life_s
    return gpus * (math.exp(-k * (now - end)) - math.exp(-k * (now - start))) / k


class Usage:
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


def alloc_of(placement: Placement) -> list[tuple[str, int]]:
    return [(a.node, len(a.gpu_indices)) for a in placement.assignments]


def gpu_label(job: QueuedJob) -> str:
    models = "/".join(job.gpu_models) if job.gpu_models else ""
    return f"{job.gpus} free {models + ' ' if models else ''}GPU{'s' if job.gpus != 1 else ''}"


def when_label(t: float) -> str:
    """A time of the policy's clock (seconds since the Unix epoch, as the dispatcher's) as ISO 8601
    UTC to the second: what reasons show, never the epoch number (API.md "Honest waiting"; the
    reader adds the relative time, apps/admission/waiting.py)."""
    return datetime.fromtimestamp(round(t), tz=UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def whose(job: QueuedJob, other: QueuedJob | RunningJob | None, level_of: Mapping[str, int]) -> str:
    """Another job as `job`'s owner may see it: "your job <id>" when it is their tenant's, else
    only its standing ("a job of a higher tier", of the same tier): never another tenant's id."""
    if other is None:
        return "a job ahead"
    if other.tenant == job.tenant:
        return f"your job {other.job_id}"
    mine, theirs = level_of.get(job.tier, 0), level_of.get(other.tier, 0)
    if theirs > mine:
        return "a job of a higher tier"
    if other.tier == job.tier:
        return "a job of your tier ahead in queue order"
    return "a job ahead in queue order"
