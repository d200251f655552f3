"""The policy's incremental state: queue, free GPUs per node, usage, reservations held.

`Scheduler` is what the simulator keeps alive and feeds events (`submit`, `finish`, ...); the
stateless `policy.decide` builds a fresh one per tick. A pass over it is passes.py.
"""

from __future__ import annotations

import math
from bisect import bisect_left, insort
from collections.abc import Callable, Iterable, Iterator, Mapping

from apps.scheduling.core.model import Node, Pod
from apps.scheduling.core.policy.capacity import FreeView, Reservation
from apps.scheduling.core.policy.cluster import PolicyCluster
from apps.scheduling.core.policy.model import (
    ArrivingNode,
    Decision,
    PolicyConfig,
    Pool,
    QueuedJob,
    RunningJob,
    Shares,
    TierPolicy,
    Usage,
    alloc_of,
    pool_of,
)
from apps.scheduling.core.policy.order import QueueIndex
from apps.scheduling.core.policy.passes import Pass
from apps.scheduling.core.policy.sort import make_ordering
from apps.scheduling.core.policy.victims import make_victim_cost


class Scheduler:
    """The policy with its incremental state (queue, free GPUs, usage, held reservation).

    Every method is O(1) or O(log n) except `decide`, whose cost is bounded by
    `backfill_depth` jobs looked at, each costing O(log Q) to order plus, when it may fit, one
    placement call.
    """

    def __init__(
        self,
        cluster: PolicyCluster,
        tiers: Mapping[str, TierPolicy],
        config: PolicyConfig | None = None,
        *,
        pod_type: Callable[..., Pod] | None = None,
        tenant_weights: Mapping[str, float] | None = None,
    ) -> None:
        self.cluster = cluster
        self.tiers = dict(tiers)
        self.config = config or PolicyConfig()
        self.ordering = make_ordering(self.config)
        self.victim_cost = make_victim_cost(self.config.victim_cost)
        self._pod_type: Callable[..., Pod] = pod_type or Pod
        self.tenant_weights = dict(tenant_weights or {})
        self.view = FreeView()
        self.queued: dict[str, QueuedJob] = {}
        self.running: dict[str, RunningJob] = {}
        self.index = QueueIndex(lambda tier: self.tiers[tier].level)
        self.pools: dict[Pool, int] = {}  # queued jobs per resource pool
        self._ends: list[tuple[float, int, str]] = []  # running jobs by estimated end
        self._end_key: dict[str, tuple[float, int, str]] = {}
        self._seq = 0
        self._tenant_usage: dict[str, Usage] = {}
        self._tenant_tier: dict[str, str] = {}
        self._running_of: dict[str, dict[str, RunningJob]] = {}  # tenant -> its running jobs
        self._tier_usage: dict[str, Usage] = {t: Usage() for t in self.tiers}
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
        self._draining: set[str] = set()  # nodes that take no new work (see drain_node)
        self.now = 0.0

    # --- state changes --------------------------------------------------------------------

    def add_node(self, node: Node, *, in_cluster: bool = False) -> None:
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
        self._count_pool(job, 1)
        self._tenant_tier[job.tenant] = job.tier
        self.index.add(job.tier, job.tenant, job.submit, job.seq, job)
        self._arrived.append(job)
        self.ordering.submitted(self, job)

    def cancel(self, job_id: str) -> None:
        """Drop a queued job."""
        job = self.queued.pop(job_id)
        self._count_pool(job, -1)
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
        tier_usage = self._tier_usage.setdefault(tier, Usage())
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
            return Pass(self, now, explain, order=iter(live)).run()
        self._changed = False
        self._last_full = now
        return Pass(self, now, explain).run()

    def _urgent(self, job: QueuedJob) -> bool:
        """Whether an arrival needs a full pass: it may preempt, or outranks the held jobs."""
        if self.ordering.every_arrival_urgent:
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

    def _count_pool(self, job: QueuedJob, delta: int) -> None:
        pool = pool_of(job)
        left = self.pools.get(pool, 0) + delta
        if left > 0:
            self.pools[pool] = left
        else:
            self.pools.pop(pool, None)

    def _usage_of(self, tenant: str) -> Usage:
        usage = self._tenant_usage.get(tenant)
        if usage is None:
            usage = self._tenant_usage[tenant] = Usage()
        return usage

    def _add_running(self, job: RunningJob, now: float) -> None:
        if not job.alloc:
            job.alloc = alloc_of(job.placement)
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
        self._tier_usage.setdefault(job.tier, Usage()).change(now, half_life, gpus)
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

    def _pod(self, job: QueuedJob | RunningJob) -> Pod:
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

    def _order(self, now: float, shares: Shares | None = None) -> Iterator[QueuedJob]:
        return self.ordering.order(self, now, {} if shares is None else shares)


def busy_beyond_running(scheduler: Scheduler, cluster: PolicyCluster) -> None:
    """Count as busy what the cluster cannot give: other pods, cordoned nodes, unhealthy GPUs
    (policy.decide, and the forecast that runs the policy forward)."""
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
