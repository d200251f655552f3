"""The discrete-event loop: arrivals, finishes and preemptions driving the real policy.

Each distinct event time is one step: finishes and preemption releases first, then node changes,
then arrivals, then one `Scheduler.decide` pass, whose decisions are applied. The scheduler keeps
its ClusterManager and indexes between steps, so a step costs what the pass looks at, not the
size of the queue.

Preemption cost model (`--checkpoint-interval C`, `--restart-overhead R`, `--grace G`):
a job saves its progress every C seconds of progress (C = 0: never). When preempted at t it
gets G seconds to exit and holds its GPUs until then (the preemptor waits, holding the
reservation, and starts on the pass after the release); it keeps the progress of its last save,
the rest of the run (including the grace period) is lost, and when it runs again it first spends
R seconds restarting, also lost. So for every job the sum of its segments equals its
duration plus its lost time, which the segments validator checks.

Autoscaling (issue 7, apps/scheduling/sim/autoscale.py): `add_node_at(t, node, requested_at=)`
and `remove_node_at(t, name)` schedule node changes as events, `tick_at(t)` asks for a pass at t
(a hook's timer), and `hooks` are called as `hook(sim, t)` after every pass. A NODE_DOWN removes
an idle node at once; a node that still runs something is drained (no new work) and goes when
its last job ends, so nothing is ever evicted. Every node is paid from the moment it is
requested (a cloud bills a booting machine) until it is removed or the simulation ends (the last
event); the nodes present at the start are paid from the first submission.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from apps.scheduling.core import ClusterManager, Node
from apps.scheduling.core.policy import (
    PolicyConfig,
    Preempt,
    QueuedJob,
    Scheduler,
    Start,
    TierPolicy,
)
from apps.scheduling.sim.workload import SimJob

FINISH, RELEASE, NODE_UP, NODE_DOWN, WAKE, TICK = 0, 1, 2, 3, 4, 5


@dataclass
class SimSettings:
    nodes: int
    gpus_per_node: int
    gpu_model: str = "GPU"
    checkpoint_interval_s: float = 1800.0
    restart_overhead_s: float = 300.0
    grace_s: float = 30.0
    strategy: str | None = "best-fit"
    nodes_per_rack: int = 0  # > 0: label nodes rack=rK (and zone=zK per 4 racks)
    sample_s: float = 300.0  # fairness sampling period


@dataclass
class Accumulators:
    """Time integrals gathered while the simulation runs."""

    wait_time: float = 0.0  # seconds during which some job was queued
    busy_while_waiting: float = 0.0  # allocated GPU-seconds during those seconds
    total_while_waiting: float = 0.0  # cluster GPU-seconds during those seconds
    busy: float = 0.0
    capacity: float = 0.0
    fair: dict[str, dict[str, list[float]]] = field(default_factory=dict)  # tier->tenant->[A, F]


class Simulation:
    def __init__(
        self,
        jobs: list[SimJob],
        settings: SimSettings,
        tiers: dict[str, TierPolicy],
        config: PolicyConfig,
    ) -> None:
        self.jobs = sorted(jobs, key=lambda j: j.submit)
        self.by_id = {j.job_id: j for j in self.jobs}
        self.settings = settings
        self.cluster = ClusterManager(settings.strategy)
        self.scheduler = Scheduler(self.cluster, tiers, config)
        self.events: list[tuple[float, int, int, Any]] = []
        self.hooks: list[Callable[[Simulation, float], None]] = []
        self.acc = Accumulators()
        self.queued_gpus: dict[str, int] = {}  # tenant -> GPUs of its queued jobs
        self.tier_of: dict[str, str] = {}
        self.decisions = 0
        self.preempt_decisions = 0
        self._seq = 0
        self._wake_pending = math.inf
        self._last_t = 0.0
        self._next_sample = 0.0
        self._last_sample = 0.0
        self._arrivals = 0  # jobs of `self.jobs` that arrived so far
        self._ticks = 0  # TICK events in the heap
        self.arrival_hooks: list[Callable[[Simulation, SimJob, float], None]] = []
        # node name -> [requested at, up at (None: still coming), down at (None: still there), gpus]
        start = self.jobs[0].submit if self.jobs else 0.0
        self.billing: dict[str, list] = {}
        self.draining: set[str] = set()  # asked to go while running something
        self.end_t = start
        for i in range(settings.nodes):
            node = self._node(i)
            self.scheduler.add_node(node)
            self.billing[node.name] = [start, start, None, node.gpus]

    def _node(self, i: int) -> Node:
        s = self.settings
        labels = {}
        if s.nodes_per_rack > 0:
            rack = i // s.nodes_per_rack
            labels = {"rack": f"r{rack}", "zone": f"z{rack // 4}"}
        return Node(f"n{i:04d}", s.gpus_per_node, s.gpu_model, labels=labels)

    # --- scheduling events -------------------------------------------------------------------

    def push(self, t: float, kind: int, payload: Any) -> None:
        self._seq += 1
        heapq.heappush(self.events, (t, kind, self._seq, payload))

    def add_node_at(self, t: float, node: Node, requested_at: float | None = None) -> None:
        """The node joins at t; it is paid from `requested_at` (default t)."""
        self.billing[node.name] = [
            t if requested_at is None else requested_at,
            None,
            None,
            node.gpus,
        ]
        self.push(t, NODE_UP, node)

    def remove_node_at(self, t: float, name: str) -> None:
        self.push(t, NODE_DOWN, name)

    def tick_at(self, t: float) -> None:
        """A pass (and so the hooks) at t, while there is still work to simulate."""
        self._ticks += 1
        self.push(t, TICK, None)

    def has_work(self) -> bool:
        """Jobs still to arrive, or events other than ticks pending."""
        return self._arrivals < len(self.jobs) or len(self.events) > self._ticks

    def node_jobs(self, name: str) -> list[str]:
        """Running jobs with a part on the node."""
        return [
            j.job_id for j in self.scheduler.running.values() if any(n == name for n, _ in j.alloc)
        ]

    def paid_gpu_hours(self, end: float | None = None) -> float:
        """GPU-hours paid: each node from its request to its removal (or `end`, default the
        last event)."""
        end = self.end_t if end is None else end
        total = 0.0
        for requested, _up, down, gpus in self.billing.values():
            stop = end if down is None else min(down, end)
            total += max(0.0, stop - requested) * gpus
        return total / 3600.0

    # --- the loop ------------------------------------------------------------------------------

    def run(self) -> None:
        jobs, events = self.jobs, self.events
        n, i = len(jobs), 0
        inf = math.inf
        while i < n or events:
            t = min(jobs[i].submit if i < n else inf, events[0][0] if events else inf)
            # (a zero grace period releases victims at the same t: a second pass at t follows)
            self._account(t)
            self.end_t = max(self.end_t, t)
            while events and events[0][0] <= t:
                _, kind, _, payload = heapq.heappop(events)
                self._handle(kind, payload, t)
            while i < n and jobs[i].submit <= t:
                self._arrive(jobs[i])
                i += 1
                self._arrivals = i
                for arrival_hook in self.arrival_hooks:
                    arrival_hook(self, jobs[i - 1], t)
            self._apply(self.scheduler.decide(t), t)
            wake = self.scheduler.wake_at
            if t < wake < self._wake_pending:
                self._wake_pending = wake
                self.push(wake, WAKE, None)
            for hook in self.hooks:
                hook(self, t)

    def _handle(self, kind: int, payload: Any, t: float) -> None:
        if kind == FINISH:
            job_id, attempt = payload
            self._finished(job_id, attempt, t)
        elif kind == RELEASE:
            job_id, attempt, signal_t = payload
            self._released(job_id, attempt, signal_t, t)
        elif kind == NODE_UP:
            self.scheduler.add_node(payload)
            self.billing[payload.name][1] = t
        elif kind == TICK:
            self._ticks -= 1
        elif kind == WAKE:
            if self._wake_pending <= t:
                self._wake_pending = math.inf
        elif kind == NODE_DOWN:
            self._node_down(payload, t)

    def _node_down(self, name: str, t: float) -> None:
        """Remove an idle node now; drain a busy one (it goes when its last job ends)."""
        if name not in self.scheduler.view.capacity:
            return  # already gone
        if self.node_jobs(name):
            self.draining.add(name)
            self.scheduler.drain_node(name)
            return
        self.scheduler.remove_node(name)
        self.draining.discard(name)
        self.billing[name][2] = t

    def _drained(self, alloc: list[tuple[str, int]], t: float) -> None:
        for name, _ in alloc:
            if name in self.draining and not self.node_jobs(name):
                self._node_down(name, t)

    def _arrive(self, job: SimJob) -> None:
        self.tier_of[job.tenant] = job.tier
        self._queue(job, job.duration, 0)

    def _queue(self, job: SimJob, est: float, preemptions: int) -> None:
        s = self.settings
        self.scheduler.submit(
            QueuedJob(
                job.job_id, job.tenant, job.tier, job.gpus, job.submit, est, nodes=job.nodes,
                preemptions=preemptions, checkpoint_interval_s=s.checkpoint_interval_s,
                restart_cost_s=s.restart_overhead_s,
            )
        )  # fmt: skip
        self.queued_gpus[job.tenant] = self.queued_gpus.get(job.tenant, 0) + job.gpus * job.nodes

    def _apply(self, decisions: list, t: float) -> None:
        for d in decisions:
            if isinstance(d, Start):
                self._start(self.by_id[d.job_id], d.placement, t)
            elif isinstance(d, Preempt):
                self.preempt_decisions += 1
                for victim in d.victim_ids:
                    self._signal(self.by_id[victim], t)
        self.decisions += len(decisions)

    def _start(self, job: SimJob, placement: Any, t: float) -> None:
        s = self.settings
        job.attempt += 1
        if job.start is None:
            job.start = t
        overhead = s.restart_overhead_s if job.preemptions else 0.0
        job.seg_start = t
        job.seg_progress_from = t + overhead
        job.seg_nodes = ";".join(a.node for a in placement.assignments)
        self.queued_gpus[job.tenant] -= job.gpus * job.nodes
        self.push(t + overhead + (job.duration - job.done), FINISH, (job.job_id, job.attempt))

    def _finished(self, job_id: str, attempt: int, t: float) -> None:
        job = self.by_id[job_id]
        if attempt != job.attempt:
            return
        ended = self.scheduler.finish(job_id, t)  # possibly within its grace period: no loss
        if self.draining:
            self._drained(ended.alloc, t)
        job.attempt += 1
        self._close_segment(job, t, "finish", kept=job.duration - job.done)
        job.done = job.duration
        job.end = t

    def _signal(self, job: SimJob, t: float) -> None:
        """Preemption signal at t: the job stops at t + grace (unless it finishes first)."""
        self.push(t + self.settings.grace_s, RELEASE, (job.job_id, job.attempt, t))

    def _released(self, job_id: str, attempt: int, signal_t: float, t: float) -> None:
        job = self.by_id[job_id]
        if attempt != job.attempt:
            return  # it finished during the grace period
        ended = self.scheduler.finish(job_id, t)
        if self.draining:
            self._drained(ended.alloc, t)
        job.attempt += 1
        interval = self.settings.checkpoint_interval_s
        progress = max(0.0, signal_t - job.seg_progress_from)
        saved = (progress // interval) * interval if interval > 0 else 0.0
        saved = min(saved, job.duration - job.done)
        self._close_segment(job, t, "preempt", kept=saved)
        job.done += saved
        job.preemptions += 1
        remaining = job.duration - job.done
        self._queue(job, self.settings.restart_overhead_s + remaining, job.preemptions)

    def _close_segment(self, job: SimJob, t: float, how: str, kept: float) -> None:
        length = t - job.seg_start
        job.lost_s += max(0.0, length - kept)
        job.segments.append((job.seg_start, t, job.seg_nodes, how))

    # --- integrals ----------------------------------------------------------------------------

    def _account(self, t: float) -> None:
        dt = t - self._last_t
        if dt <= 0:
            return
        view = self.scheduler.view
        busy = (view.total - view.free_total) * dt
        self.acc.busy += busy
        self.acc.capacity += view.total * dt
        if self.scheduler.index.count:
            self.acc.wait_time += dt
            self.acc.busy_while_waiting += busy
            self.acc.total_while_waiting += view.total * dt
        if t >= self._next_sample:
            self._sample_fairness(t - self._last_sample)
            self._last_sample = t
            self._next_sample = t + self.settings.sample_s
        self._last_t = t

    def _sample_fairness(self, weight: float) -> None:
        """Per tier, each tenant's GPUs against its max-min fair share of the tier's GPUs."""
        usage = self.scheduler._tenant_usage
        by_tier: dict[str, dict[str, tuple[int, int]]] = {}
        for tenant, tier in self.tier_of.items():
            running = usage[tenant].running if tenant in usage else 0
            queued = self.queued_gpus.get(tenant, 0)
            if running or queued:
                by_tier.setdefault(tier, {})[tenant] = (running, running + queued)
        for tier, tenants in by_tier.items():
            if not any(d > a for a, d in tenants.values()):
                continue  # nobody in this tier waits: no contention to share
            shares = max_min_shares(
                sum(a for a, _ in tenants.values()), {k: d for k, (_, d) in tenants.items()}
            )
            acc = self.acc.fair.setdefault(tier, {})
            for tenant, (alloc, _) in tenants.items():
                pair = acc.setdefault(tenant, [0.0, 0.0])
                pair[0] += alloc * weight
                pair[1] += shares[tenant] * weight


def max_min_shares(total: float, demands: dict[str, float]) -> dict[str, float]:
    """Water-filling: each tenant gets min(demand, level) with the shares summing to `total`."""
    shares = {}
    left = total
    ordered = sorted(demands.items(), key=lambda kv: kv[1])
    for k, (tenant, demand) in enumerate(ordered):
        level = left / (len(ordered) - k)
        shares[tenant] = min(demand, level)
        left -= shares[tenant]
    return shares
