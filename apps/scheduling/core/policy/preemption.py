"""Preemption in one pass (Kubernetes' PostFilter): which blocked job may preempt, whom, and when.

A job may preempt preemptible jobs of a lower level, or, when its tier is under its guarantee,
of a same-level tier over its guarantee; with `tenant_reclaim`, a tenant below its share of its
tier may reclaim from a tenant above it. Victims must have run `min_runtime_s` and been preempted
fewer than `max_preemptions` times. The cheapest set by the configured `VictimCost`
(victims.py) is planned by preempt.py, and nothing is preempted unless the job then
really fits (a dry run against the placement core).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Protocol

from apps.scheduling.core.model import Pod
from apps.scheduling.core.policy.capacity import FreeView
from apps.scheduling.core.policy.cluster import PolicyCluster
from apps.scheduling.core.policy.model import (
    ArrivingNode,
    Decision,
    PolicyConfig,
    Preempt,
    QueuedJob,
    RunningJob,
    Shares,
    TierPolicy,
    Usage,
)
from apps.scheduling.core.policy.order import QueueIndex
from apps.scheduling.core.policy.preempt import plan_victims
from apps.scheduling.core.policy.victims import VictimCost


class PreemptionScheduler(Protocol):
    """What preemption reads and changes of the scheduler (`Scheduler` satisfies it)."""

    tiers: dict[str, TierPolicy]
    queued: dict[str, QueuedJob]
    running: dict[str, RunningJob]
    view: FreeView
    index: QueueIndex
    cluster: PolicyCluster
    arriving: list[ArrivingNode]
    victim_cost: VictimCost
    wake_at: float
    _preemptible_running: int
    _plan_failed: dict[str, float]
    _reclaim_failed: dict[str, float]
    _victims_of: dict[str, set[str]]
    _running_of: dict[str, dict[str, RunningJob]]

    def tier_gpus(self, tier: str) -> int: ...

    def tenant_shares(self, tier: str) -> dict[str, tuple[int, float]]: ...

    def _usage_of(self, tenant: str) -> Usage: ...

    def _pod(self, job: QueuedJob | RunningJob) -> Pod: ...

    def _signal(self, victim: RunningJob, for_job: str, release: float) -> None: ...


class PreemptionPass(Protocol):
    """What preemption uses of the pass (`Pass` satisfies it)."""

    now: float
    cfg: PolicyConfig
    shares: Shares
    out: list[Decision]

    @property
    def s(self) -> PreemptionScheduler: ...


Plan = tuple[list[RunningJob], float]


class Preemption:
    """The preemption budget and bookkeeping of one pass."""

    def __init__(self, p: PreemptionPass) -> None:
        self.p = p
        self.s: PreemptionScheduler = p.s
        self.now = p.now
        self.cfg = p.cfg
        self.plans_left = self.cfg.preempt_plans_per_pass if self.cfg.preemption else 0
        self.could_preempt: dict[str, bool] = {}
        self.reclaimers: dict[str, set[str]] = {}  # reclaim-only tier -> tenants below share
        self.reclaims_left = 1  # reclaim plans left in this pass (reclaim is never urgent)
        self._room: dict[str, float] = {}  # tenant -> GPUs it may still reclaim in this pass

    # --- who may preempt --------------------------------------------------------------------

    def preemptors_queued(self) -> tuple[int, int]:
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
                reclaim += self._reclaimers_of(name)
                continue
            self.could_preempt[name] = able
            if able:
                count += sum(len(tq.items) for tq in s.index.queues([name]))
        return count, reclaim

    def _reclaimers_of(self, name: str) -> int:
        """Reclaim only: the tenants below their share, while some tenant is above; how many
        queued jobs they have."""
        s = self.s
        shares = self.p.shares[name] = s.tenant_shares(name)
        if not any(run > share for run, share in shares.values()):
            return 0
        below = {t for t, (run, share) in shares.items() if run < share}
        self.reclaimers[name] = below
        self.could_preempt[name] = bool(below)
        return sum(len(tq.items) for tq in s.index.queues([name]) if tq.tenant in below)

    def may_preempt(self, job: QueuedJob) -> bool:
        if self.plans_left <= 0 or not self.could_preempt.get(job.tier, False):
            return False
        reclaimers = self.reclaimers.get(job.tier)
        return reclaimers is None or (self.reclaims_left > 0 and job.tenant in reclaimers)

    def above_victims(self, tier: TierPolicy) -> bool:
        """Whether the tier outranks some preemptible tier (preemption by level, not reclaim)."""
        lowest = min((t.level for t in self.s.tiers.values() if t.preemptible), default=math.inf)
        return tier.level > lowest

    # --- one plan ---------------------------------------------------------------------------

    def try_preempt(
        self, job: QueuedJob, tier: TierPolicy, avoid: set[str] | frozenset[str] = frozenset()
    ) -> bool:
        """Plan victims for `job` (off the `avoid` nodes) and signal them if it then fits."""
        reclaimers = self.reclaimers.get(job.tier)
        if not self._may_plan(job, reclaimers):
            return False
        coming = self._capacity_coming(job, tier)
        if coming is not None:
            self.s.wake_at = min(self.s.wake_at, coming)  # look again when it is there
            return False
        self.plans_left -= 1
        plan = self._plan(job, tier, reclaimers, avoid)
        if plan is None or not self._evict_and_place(job, tier, *plan):
            self._retry_later(job, reclaimers)
            return False
        self.s._plan_failed.pop(job.job_id, None)
        return True

    def _may_plan(self, job: QueuedJob, reclaimers: set[str] | None) -> bool:
        s = self.s
        if not self.may_preempt(job):
            return False
        if self.now < s._plan_failed.get(job.job_id, -math.inf) or job.job_id in s._victims_of:
            return False  # failed recently, or its victims are still stopping
        if reclaimers is not None:  # its tier may only reclaim: one plan a pass, if this job may
            if (
                self.reclaims_left <= 0
                or self.now < s._reclaim_failed.get(job.tier, -math.inf)
                or not self._may_reclaim(job, reclaimers)
            ):
                return False
            self.reclaims_left -= 1
        return True

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

    def _plan(
        self,
        job: QueuedJob,
        tier: TierPolicy,
        reclaimers: set[str] | None,
        avoid: set[str] | frozenset[str],
    ) -> Plan | None:
        s = self.s
        victims = [
            v
            for v in self._pool(job, reclaimers)
            if self._victim_ok(job, tier, v) and not (avoid and any(n in avoid for n, _ in v.alloc))
        ]
        if not victims:
            return None
        allowed = set(s.view.models_for(job.gpu_models))
        free = s.view.free
        if avoid:
            free = {node: f for node, f in free.items() if node not in avoid}
        plan = plan_victims(job.gpus, job.nodes, allowed, free, s.view.model, victims, self._cost)
        if plan is not None and self._below_share(job, plan[0]):
            return None  # together the victims would take their tenant below its share
        return plan

    def _pool(self, job: QueuedJob, reclaimers: set[str] | None) -> Iterable[RunningJob]:
        """The running jobs to choose victims from: all, or when reclaiming only the jobs of
        tenants above their share."""
        s = self.s
        if reclaimers is None:
            return s.running.values()
        return [
            v
            for t in self._tier_shares(job.tier)
            if self._surplus(job.tier, t) > 0
            for v in s._running_of.get(t, {}).values()
        ]

    def _below_share(self, job: QueuedJob, victims: list[RunningJob]) -> bool:
        taken: dict[str, int] = {}
        for v in victims:
            if v.tier == job.tier:
                taken[v.tenant] = taken.get(v.tenant, 0) + v.gpus * v.nodes
        return any(n > self._surplus(job.tier, t) for t, n in taken.items())

    def _retry_later(self, job: QueuedJob, reclaimers: set[str] | None) -> None:
        s = self.s
        if reclaimers is not None:  # reclaim is never urgent: the tier waits a while
            s._reclaim_failed[job.tier] = self.now + self.cfg.preempt_retry_s
            return
        soonest = self._next_eligible()  # a new victim may become eligible then
        s._plan_failed[job.job_id] = min(self.now + self.cfg.preempt_retry_s, soonest)
        s.wake_at = min(s.wake_at, soonest)

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

    # --- who may be a victim ----------------------------------------------------------------

    def _victim_ok(self, job: QueuedJob, tier: TierPolicy, victim: RunningJob) -> bool:
        vt = self.s.tiers[victim.tier]
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
        return self._reclaims_guarantee(job, tier, victim, vt)

    def _reclaims_guarantee(
        self, job: QueuedJob, tier: TierPolicy, victim: RunningJob, vt: TierPolicy
    ) -> bool:
        """Same level: reclaim a guarantee from a tier that is borrowing beyond its own."""
        s = self.s
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
        shares = self.p.shares.get(tier)
        if shares is None:
            shares = self.p.shares[tier] = self.s.tenant_shares(tier)
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
        return self.s.victim_cost.cost(victim, self.now)

    # --- signalling -------------------------------------------------------------------------

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
            f"preempting {len(ids)} job(s) of lower standing for a job of tier {tier.name} "
            f"(tier {tier.name}); lost GPU-time {cost / 3600:.2f} GPU-h"
        )
        self.p.out.append(Preempt(ids, job.job_id, why, cost))
        return True
