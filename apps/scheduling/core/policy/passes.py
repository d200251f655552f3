"""One scheduling pass: the queued jobs in queue order, each started, backfilled, preempted for,
reserved for, or told why it waits.

The pass is a list of named steps; the rules it composes live beside it: the order in
sort.py (`QueueSort`), reservations and backfill in backfill.py (`Backfill`),
preemption in preemption.py with its cost in victims.py (`VictimCost`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Protocol

from apps.scheduling.core.model import Placement
from apps.scheduling.core.policy.backfill import BackfillScheduler, Reservations, make_backfill
from apps.scheduling.core.policy.capacity import Reservation
from apps.scheduling.core.policy.model import (
    Decision,
    Pool,
    QueuedJob,
    RunningJob,
    Shares,
    Start,
    TierPolicy,
    Wait,
    alloc_of,
    gpu_label,
    pool_of,
    when_label,
    whose,
)
from apps.scheduling.core.policy.preemption import Preemption, PreemptionScheduler
from apps.scheduling.core.policy.sort import QueueSort


class PassScheduler(BackfillScheduler, PreemptionScheduler, Protocol):
    """What a pass uses of the scheduler: what its reservations and its preemption use, and
    the queue it walks (`Scheduler` satisfies it)."""

    ordering: QueueSort
    pools: dict[Pool, int]

    def _order(self, now: float, shares: Shares | None = None) -> Iterator[QueuedJob]: ...

    def _tier_cap(self, tier: TierPolicy) -> float: ...

    def _add_running(self, job: RunningJob, now: float) -> None: ...

    def _count_pool(self, job: QueuedJob, delta: int) -> None: ...


class Pass:
    """One `decide` pass over a `Scheduler`'s state; `run` returns its decisions in order."""

    def __init__(
        self,
        scheduler: PassScheduler,
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
        self.shares: Shares = {}  # tenant_shares per tier, as of the pass's start
        self.preempt = Preemption(self)
        self.backfill = make_backfill(self.cfg)
        self.resv = Reservations(self)
        self.resv.load()

    # --- the loop -------------------------------------------------------------------------

    def run(self) -> list[Decision]:
        """The jobs in queue order. The backfill window (`backfill_depth` jobs looked at) and the
        miss count (`backfill_misses` in a row that could not start) are kept per resource pool
        (`pool_of`: the nodes a job may use), so one pool's backlog never stops the pass for
        another; the pass ends when every pool with queued jobs is done."""
        order = self.order if self.order is not None else self.s._order(self.now, self.shares)
        preemptors_left, reclaimers_left = self.preempt.preemptors_queued()
        self._start_held()
        scanned: dict[Pool, int] = {}
        misses: dict[Pool, int] = {}
        done: set[Pool] = set()  # pools whose window is spent or that missed too often
        live = max(1, sum(1 for n in self.s.pools.values() if n > 0))
        depth, most_misses = self.cfg.backfill_depth, self.cfg.backfill_misses
        early = {job.job_id for job in self.taken}
        for job in order:
            if early and job.job_id in early:
                continue
            pool = pool_of(job)
            if pool in done:
                self.wait(job, "behind {} jobs in queue order", scanned[pool])
                continue
            seen = scanned[pool] = scanned.get(pool, 0) + 1
            if seen > depth or misses.get(pool, 0) >= most_misses:
                scanned[pool] = seen - 1
                done.add(pool)
                self.wait(job, "behind {} jobs in queue order", seen - 1)
                if len(done) >= live:
                    break
                continue
            started = len(self.taken)
            preemptor = self.preempt.may_preempt(job)
            reclaimers = self.preempt.reclaimers
            if job.tier in reclaimers:
                reclaimers_left -= job.tenant in reclaimers[job.tier]
            else:
                preemptors_left -= preemptor
            if self.s.view.free_total == 0 and not preemptor and self.resv.in_pool(job):
                # Nothing starts without preemption and its pool has its reservation; once no
                # job left could preempt, the pool is done.
                if job.job_id in self.resv.head_of:
                    self.resv.make_head(job)  # it keeps its reservation: say so again
                    continue
                self.wait(job, self.shortage, job)
                misses[pool] = misses.get(pool, 0) + 1
                if self._no_preemptor_left(preemptors_left, reclaimers_left):
                    done.add(pool)
                    if len(done) >= live:
                        break
                continue
            if not self._step(job):
                break
            if len(self.taken) > started or not self.resv.in_pool(job):
                misses[pool] = 0
            else:
                misses[pool] = misses.get(pool, 0) + 1
        if self.explain:
            for job in order:
                self.wait(job, "behind the jobs ahead in queue order")
        self._finish()
        return self.out

    def _no_preemptor_left(self, preemptors_left: int, reclaimers_left: int) -> bool:
        preempt = self.preempt
        return preempt.plans_left <= 0 or (
            preemptors_left <= 0 and (reclaimers_left <= 0 or preempt.reclaims_left <= 0)
        )

    def _start_held(self) -> None:
        """A job holding a reservation starts as soon as it fits: it is first in line (unless
        a job of a higher level is queued: strict priority comes first)."""
        s = self.s
        top = max(
            (lvl for lvl, tiers in s.index.levels.items() if any(s.index.queues(tiers))),
            default=None,
        )
        for resv in list(self.resv.heads):
            job = s.queued.get(resv.job_id)
            if job is None:
                continue
            tier = s.tiers[job.tier]
            if top is not None and tier.level < top and s.ordering.levels_first:
                continue
            if s.tier_gpus(job.tier) + job.gpus * job.nodes > s._tier_cap(tier):
                continue
            binding = [
                r
                for r in self.resv.heads
                if r is not resv and r.level >= tier.level and r.holds_for(job.gpu_models)
            ]
            placement = self.resv.place(job, binding)
            if placement is not None:
                self.resv.drop(job.job_id)
                self._started(job, placement, self._start_reason(job, tier, "reserved, now free"))

    def _step(self, job: QueuedJob) -> bool:
        """Handle one job; False stops the pass (FIFO without backfill: head-of-line blocking)."""
        s = self.s
        tier = s.tiers[job.tier]
        if s.tier_gpus(job.tier) + job.gpus * job.nodes > s._tier_cap(tier):
            self.wait(job, self._at_cap, job)
            return True
        if not self.resv.heads:
            return self._front(job, tier)
        binding = self.resv.binding(job, tier.level)
        if not binding:
            return self._front(job, tier)
        self._behind(job, tier, binding)
        return True

    def _front(self, job: QueuedJob, tier: TierPolicy) -> bool:
        """Nothing of its standing is reserved ahead of it: start, preempt, or reserve."""
        placement = self.resv.place(job, [])
        if placement is not None:
            if self.resv.heads and job.job_id not in self.resv.head_of:
                self.invalid = True  # it outranks the holders: their reservations may move
            self.resv.drop(job.job_id)
            self._started(job, placement, self._start_reason(job, tier, "first in line"))
            return True
        if self.preempt.try_preempt(job, tier):
            self.invalid = True  # the victims now end at the signal + grace
            self.resv.drop(job.job_id)
            return self.backfill.preempted(self, job)
        return self.backfill.blocked(self, job)

    def _behind(self, job: QueuedJob, tier: TierPolicy, binding: list[Reservation]) -> None:
        """Backfill: start only if it ends before a reservation or leaves its GPUs alone."""
        end = self.now + job.est_runtime_s
        hard = [r for r in binding if end > r.shadow]
        placement = self.resv.place(job, hard)
        if placement is not None:
            self._backfilled(job, tier, placement, [r for r in binding if end <= r.shadow])
            return
        if self._preempt_behind(job, tier, binding):
            return
        if job.job_id in self.resv.head_of or len(self.resv.heads) < self.cfg.reservations:
            self.resv.make_head(job)
            return
        self.wait(job, self._behind_reason, job, hard)

    def _backfilled(
        self, job: QueuedJob, tier: TierPolicy, placement: Placement, soft: list[Reservation]
    ) -> None:
        """It ends before the `soft` reservations: what it holds is released by then."""
        for node, n in alloc_of(placement):
            for resv in soft:
                if node in resv.need:
                    resv.released[node] = resv.released.get(node, 0) + n
        self.resv.drop(job.job_id)
        self._started(job, placement, self._start_reason(job, tier, "backfilled"))

    def _preempt_behind(self, job: QueuedJob, tier: TierPolicy, binding: list[Reservation]) -> bool:
        """It may preempt too (several top-level jobs at once), but never on reserved nodes."""
        if not self.preempt.may_preempt(job):
            return False
        top = max(r.level for r in binding)
        if not (
            tier.level > top
            or (tier.level == top and self.preempt.above_victims(tier))
            or (self.cfg.tenant_reclaim and tier.preemptible)
        ):
            return False
        avoid = {node for r in binding for node in r.need}
        if not self.preempt.try_preempt(job, tier, avoid):
            return False
        self.invalid = True
        self.resv.drop(job.job_id)
        self.resv.make_head(job, force=True)
        return True

    # --- starting -------------------------------------------------------------------------

    def _started(self, job: QueuedJob, placement: Placement, reason: str) -> None:
        begin = self.now
        resumed = job.restart_cost_s if job.preemptions else 0.0
        running = RunningJob(
            job.job_id, job.tenant, job.tier, job.gpus, begin, begin + job.est_runtime_s,
            placement, nodes=job.nodes, restart_cost_s=job.restart_cost_s,
            checkpoint_interval_s=job.checkpoint_interval_s, progress_from=begin + resumed,
            preemptions=job.preemptions, gpu_models=job.gpu_models,
            node_selector=job.node_selector, tolerations=job.tolerations,
        )  # fmt: skip
        self.s._add_running(running, self.now)
        self.taken.append(job)
        self.resv.failed.clear()
        self.out.append(Start(job.job_id, placement, reason))

    def _start_reason(self, job: QueuedJob, tier: TierPolicy, how: str) -> str:
        return f"{how}: {job.nodes} x {job.gpus} GPUs for tier {tier.name}, tenant {job.tenant}"

    # --- waiting and bookkeeping ------------------------------------------------------------

    def shortage(self, job: QueuedJob) -> str:
        view = self.s.view
        if job.nodes == 1:
            return f"waiting for {gpu_label(job)} on one node (most free on a node: {view.largest_free(job.gpu_models)})"
        have = view.nodes_with(job.gpus, job.gpu_models)
        return f"gang of {job.nodes} x {job.gpus}: waiting for {job.nodes} nodes with {gpu_label(job)} ({have} have them)"

    def _at_cap(self, job: QueuedJob) -> str:
        s = self.s
        cap = int(s._tier_cap(s.tiers[job.tier]))
        return f"tier {job.tier} is at its borrowing limit ({s.tier_gpus(job.tier)} of {cap} GPUs)"

    def _behind_reason(self, job: QueuedJob, hard: list[Reservation]) -> str:
        if not hard:
            return self.shortage(job)
        first = min(hard, key=lambda r: r.shadow)
        holder = self.s.queued.get(first.job_id)
        levels = {name: tier.level for name, tier in self.s.tiers.items()}
        shape = f"{holder.nodes} x {holder.gpus} GPUs, " if holder else ""
        return (
            f"GPUs reserved for {whose(job, holder, levels)} ({shape}from "
            f"{when_label(first.shadow)}); this job would run past it. {self.shortage(job)}"
        )

    def wait(self, job: QueuedJob, reason: str | Callable[..., str], *args: object) -> None:
        """Explain why a job waits; the reason is only built when explaining (it costs)."""
        if self.explain:
            text = reason(*args) if callable(reason) else reason.format(*args)
            self.out.append(Wait(job.job_id, text))

    def _finish(self) -> None:
        s = self.s
        for job in self.taken:
            del s.queued[job.job_id]
            s._count_pool(job, -1)
            s.index.remove(job.tier, job.tenant, job.submit, job.seq)
            s._plan_failed.pop(job.job_id, None)
        live = [r for r in self.resv.heads if r.job_id in s.queued]
        s._held = [r.job_id for r in live]
        s._resvs = {r.job_id: r for r in live}
        s._resv_dirty = self.invalid
