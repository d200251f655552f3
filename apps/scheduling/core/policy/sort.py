"""Queue sort: the order in which a pass looks at the queued jobs (Kubernetes' QueueSort plugin).

`PolicyConfig.ordering` names one of `ORDERINGS`; a new order is a new class registered there,
not a branch in the pass. order.py holds the queue index the orders walk (docs there).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Protocol

from apps.scheduling.core.policy.capacity import FreeView
from apps.scheduling.core.policy.model import (
    PolicyConfig,
    QueuedJob,
    Shares,
    TierPolicy,
    Usage,
    pool_of,
)
from apps.scheduling.core.policy.order import QueueIndex, SlurmPriority


class SortState(Protocol):
    """What an order reads of the scheduler: `Scheduler` satisfies it (mypy checks where the
    scheduler hands itself to its order)."""

    config: PolicyConfig
    tiers: dict[str, TierPolicy]
    tenant_weights: dict[str, float]
    index: QueueIndex
    view: FreeView
    queued: dict[str, QueuedJob]
    now: float
    _tier_usage: dict[str, Usage]
    _tenant_usage: dict[str, Usage]
    _held: list[str]

    def tenant_shares(self, tier: str) -> dict[str, tuple[int, float]]: ...

    def _usage_of(self, tenant: str) -> Usage: ...


class QueueSort(Protocol):
    name: str
    # Every arrival needs a full pass: it may go ahead of jobs already found not to fit.
    every_arrival_urgent: bool
    # A job holding a reservation waits while a higher level has queued jobs.
    levels_first: bool

    def order(self, s: SortState, now: float, shares: Shares) -> Iterator[QueuedJob]:
        """The queued jobs, first to look at first (lazily: a pass stops early)."""
        ...

    def submitted(self, s: SortState, job: QueuedJob) -> None:
        """A job joined the queue (an order that keeps its own sorted list slots it in)."""
        ...


class Fifo:
    """Submit order over everything."""

    name = "fifo"
    every_arrival_urgent = True
    levels_first = False

    def __init__(self, config: PolicyConfig) -> None:
        pass

    def order(self, s: SortState, now: float, shares: Shares) -> Iterator[QueuedJob]:
        return s.index.fifo()

    def submitted(self, s: SortState, job: QueuedJob) -> None:
        pass


class LevelFifo(Fifo):
    """Levels high to low, submit order inside a level (`strict`)."""

    name = "level-fifo"
    every_arrival_urgent = False
    levels_first = True

    def order(self, s: SortState, now: float, shares: Shares) -> Iterator[QueuedJob]:
        return s.index.level_fifo()


class FairShare(Fifo):
    """Levels high to low; aged jobs first; then weighted fair share between tiers and tenants."""

    name = "fair"
    every_arrival_urgent = False
    levels_first = True

    def order(self, s: SortState, now: float, shares: Shares) -> Iterator[QueuedJob]:
        tiers = s.tiers
        tenant_weights = s.tenant_weights
        cfg = s.config
        within_share = cfg.aging_within_share
        return s.index.fair(
            now,
            age_limit=lambda tier: tiers[tier].age_limit_s,
            tier_key=_tier_key(s, now),
            tier_weight=lambda tier: tiers[tier].weight,
            tenant_key=_tenant_key(s, now),
            tenant_weight=lambda tenant: tenant_weights.get(tenant, 1.0),
            standing=_standing(s, shares) if within_share else None,
            overdue_after=cfg.aging_above_share,
            overdue_waits=_behind_a_reservation(s) if within_share else None,
            gangs_at_limit=within_share and cfg.aging_gangs_at_limit,
        )


def _tier_key(s: SortState, now: float) -> Callable[[str, float], tuple[int, float]]:
    """A tier's standing: (at or over its guarantee, decayed GPUs / weight), with `charged`
    GPUs already yielded in this pass counted in."""
    half_life = s.config.half_life_s
    total = max(1, s.view.total)
    tiers = s.tiers

    def tier_key(tier: str, charged: float) -> tuple[int, float]:
        usage = s._tier_usage.get(tier)
        gpus = (usage.gpus(now, half_life) if usage else 0.0) + charged
        running = (usage.running if usage else 0) + charged
        over = running >= tiers[tier].guaranteed_share * total
        return int(over), gpus / tiers[tier].weight

    return tier_key


def _tenant_key(s: SortState, now: float) -> Callable[[str, str], float]:
    half_life = s.config.half_life_s
    tenant_weights = s.tenant_weights

    def tenant_key(tier: str, tenant: str) -> float:
        usage = s._tenant_usage.get(tenant)
        gpus = usage.gpus(now, half_life) if usage else 0.0
        return gpus / tenant_weights.get(tenant, 1.0)

    return tenant_key


def _behind_a_reservation(s: SortState) -> Callable[[QueuedJob], bool]:
    """Whether a queued job of the job's level holds a reservation (from an earlier pass) in
    the job's resource pool: that job starts first, within the longest runtime."""
    queued, tiers = s.queued, s.tiers
    held = {
        (tiers[queued[job_id].tier].level, pool_of(queued[job_id]))
        for job_id in s._held
        if job_id in queued
    }
    return lambda job: bool(held) and (tiers[job.tier].level, pool_of(job)) in held


def _standing(s: SortState, shares: Shares) -> Callable[[str, str], tuple[int, float, float]]:
    """A tenant's (running GPUs, max-min fair share of its tier, its weight over the weight of
    its tier's tenants with work); the shares are computed once per pass."""
    weights = s.tenant_weights
    tier_weight: dict[str, float] = {}

    def standing(tier: str, tenant: str) -> tuple[int, float, float]:
        if tier not in shares:
            shares[tier] = s.tenant_shares(tier)
        if tier not in tier_weight:
            tier_weight[tier] = sum(weights.get(t, 1.0) for t in shares[tier])
        running, share = shares[tier].get(tenant, (0, 0.0))
        total = tier_weight[tier]
        return running, share, weights.get(tenant, 1.0) / total if total > 0 else 1.0

    return standing


class SlurmMultifactor:
    """Slurm's multifactor priority (QOS + fair-share + age), see `SlurmPriority`."""

    name = "slurm"
    every_arrival_urgent = True
    levels_first = True

    def __init__(self, config: PolicyConfig) -> None:
        self.priorities = SlurmPriority(config.slurm_calc_period_s)

    def order(self, s: SortState, now: float, shares: Shares) -> Iterator[QueuedJob]:
        # A generator: the priorities are computed when the pass first asks, after the
        # reservation holders have started.
        order = self.priorities.ordered(
            now, lambda: iter(s.queued.values()), lambda job: self.priority(s, job)
        )
        queued = s.queued
        for entry in order:
            job = entry[3]
            if queued.get(job.job_id) is job:
                yield job

    def submitted(self, s: SortState, job: QueuedJob) -> None:
        self.priorities.add(job, self.priority(s, job))

    def priority(self, s: SortState, job: QueuedJob) -> float:
        cfg = s.config
        w_qos, w_fs, w_age = cfg.slurm_weights
        max_qos = max((t.qos_priority for t in s.tiers.values()), default=0) or 1
        qos = s.tiers[job.tier].qos_priority / max_qos
        half_life = cfg.half_life_s
        total = sum(u.value(s.now, half_life) for u in s._tenant_usage.values())
        weights = s.tenant_weights
        tenants = s._tenant_usage.keys() | {job.tenant}
        share = weights.get(job.tenant, 1.0) / sum(weights.get(t, 1.0) for t in tenants)
        used = s._usage_of(job.tenant).value(s.now, half_life) / total if total > 0 else 0.0
        fair_share: float = 2.0 ** (-used / share)
        age = min(1.0, max(0.0, s.now - job.submit) / cfg.slurm_max_age_s)
        return w_qos * qos + w_fs * fair_share + w_age * age


ORDERINGS: dict[str, Callable[[PolicyConfig], QueueSort]] = {
    cls.name: cls for cls in (FairShare, LevelFifo, Fifo, SlurmMultifactor)
}


def make_ordering(config: PolicyConfig) -> QueueSort:
    make = ORDERINGS.get(config.ordering)
    if make is None:
        raise ValueError(f"unknown ordering {config.ordering!r}")
    return make(config)
