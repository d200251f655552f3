"""The autoscaler in the simulator: the core's `Autoscaler` driven from a hook.

Every `interval_s` of simulated time (a TICK event keeps the clock going while there is work)
the hook builds what the platform's beat task builds (one `NodeStatus` per node, one `Demand`
per queued job, one `Pending` per node still booting) and applies the `ScaleDecision`:

- `provision`: `add_node_at(t + lag, node, requested_at=t)`; the node is paid from t.
- `terminate`: the node is idle, so NODE_DOWN removes it at once (nothing is evicted).
- `drain`: NODE_DOWN on a busy node drains it: no new work, removed when its last job ends.

Every arrival is fed to `Autoscaler.observe_arrival` (GPUs x nodes of the job). `idle_since` is
the first tick that found a node empty, so idleness is known to within one interval; `never_used`
is true until a tick finds the node running something. After every pass the booting nodes are
set as the policy's `arriving` (as the dispatcher passes pending provisions), so a tier with
`preempt_wait_s` (sim `--preempt-wait`) waits for them instead of preempting.

`decide_on_arrival` also decides right after a pass that saw arrivals. `ScaleDecision.cancel`
removes the booting nodes due last: their NODE_UP events become no-op WAKEs and billing stops at
the cancel. `oracle_lookahead_s` is analysis only (a clairvoyant reference): jobs due within it
count as queued and a pass runs that long before every submission.
"""

from __future__ import annotations

import bisect
import heapq
from dataclasses import dataclass, field
from typing import Any

from apps.scheduling.core import Node
from apps.scheduling.core.autoscale import Autoscaler, Demand, NodeStatus, Pending, SkuLimits
from apps.scheduling.core.policy import ArrivingNode
from apps.scheduling.sim.engine import NODE_UP, WAKE


@dataclass
class AutoscaleSettings:
    mode: str = "off"  # off | reactive | predictive
    provision_lag_s: float = 300.0
    min_nodes: int = 0
    max_nodes: int = 1_000_000
    cooldown_s: float = 600.0
    interval_s: float = 60.0
    burst_share: float = 0.0  # predictive: share of a recent burst to keep ready
    momentum_share: float = 0.0  # predictive: share of the current stream's pace to keep ready
    unused_cooldown_s: float = 60.0  # a node that never ran anything goes after this long idle
    spare_nodes: int = 0  # predictive: whole nodes kept free beyond the demand
    cancel_booting: bool = False  # give back booting nodes nothing wants (billed to the cancel)
    decide_on_arrival: bool = False  # also decide after every pass that saw an arrival
    unwanted_cooldown_s: float | None = None  # idle nodes the target does not want go after this
    # Analysis only (a clairvoyant reference, not a policy): jobs due within this many seconds
    # count as queued, and a pass runs this long before every arrival.
    oracle_lookahead_s: float = 0.0


@dataclass
class AutoscaleHook:
    settings: AutoscaleSettings
    gpus_per_node: int
    gpu_model: str = "GPU"
    autoscaler: Autoscaler = field(init=False)
    idle_since: dict[str, float] = field(default_factory=dict)
    ever_used: set[str] = field(default_factory=set)  # nodes seen running something
    coming: dict[str, float] = field(default_factory=dict)  # node name -> ready at
    next_tick: float = float("-inf")
    provisioned: int = 0
    terminated: int = 0
    drained: int = 0
    peak_nodes: int = 0  # up + coming, at its highest
    decisions: int = 0
    cancelled: int = 0
    _seq: int = 0
    _arrived_at: float = float("-inf")
    _oracle_ticks: set = field(default_factory=set)
    _submits: list = field(default_factory=list)

    def __post_init__(self) -> None:
        s = self.settings
        limits = SkuLimits(
            self.gpus_per_node,
            min_nodes=s.min_nodes,
            max_nodes=s.max_nodes,
            cooldown_s=s.cooldown_s,
            unused_cooldown_s=s.unused_cooldown_s,
            unwanted_cooldown_s=s.unwanted_cooldown_s,
        )
        self.autoscaler = Autoscaler(
            {self.gpu_model: limits},
            mode=s.mode,
            provision_lag_s=s.provision_lag_s,
            burst_share=s.burst_share,
            momentum_share=s.momentum_share,
            spare_nodes=s.spare_nodes,
            cancel_booting=s.cancel_booting,
        )

    def install(self, sim: Any) -> None:
        sim.hooks.append(self)
        sim.arrival_hooks.append(self.arrived)
        self.peak_nodes = len(sim.scheduler.view.capacity)
        ahead = self.settings.oracle_lookahead_s
        if ahead > 0:
            self._submits = [j.submit for j in sim.jobs]
            self._oracle_ticks = {j.submit - ahead for j in sim.jobs}
            for when in sorted(self._oracle_ticks):
                sim.tick_at(when)

    def arrived(self, sim: Any, job: Any, t: float) -> None:
        self.autoscaler.observe_arrival(self.gpu_model, t, Demand(job.gpus, job.nodes))
        self._arrived_at = t

    def __call__(self, sim: Any, t: float) -> None:
        self._arriving(sim, t)
        if self.settings.decide_on_arrival and self._arrived_at == t and t < self.next_tick:
            self._decide(sim, t)  # at once, as a submission could kick the beat task
            return
        if t in self._oracle_ticks and t < self.next_tick:
            self._decide(sim, t)
            return
        if t < self.next_tick:
            return
        interval = self.settings.interval_s
        self.next_tick = t + interval
        self._decide(sim, t)
        if sim.has_work():
            sim.tick_at(self.next_tick)

    def _decide(self, sim: Any, t: float) -> None:
        scheduler = sim.scheduler
        view = scheduler.view
        on_node: dict[str, list] = {}
        for job in scheduler.running.values():
            for name, gpus in job.alloc:
                on_node.setdefault(name, []).append((job, gpus))
        nodes = []
        for name, capacity in view.capacity.items():
            jobs = on_node.get(name, [])
            if jobs:
                self.idle_since.pop(name, None)
                self.ever_used.add(name)
                idle = None
            else:
                idle = self.idle_since.setdefault(name, t)
            nodes.append(
                NodeStatus(
                    name, capacity, view.free[name], idle_since=idle,
                    preemptible_only=bool(jobs)
                    and all(scheduler.tiers[j.tier].preemptible for j, _ in jobs),
                    draining=name in sim.draining, never_used=name not in self.ever_used,
                    freeing=tuple((j.est_end, g) for j, g in jobs),
                )
            )  # fmt: skip
        self.coming = {n: r for n, r in self.coming.items() if r > t}
        pending = [Pending(1, ready) for ready in self.coming.values()]
        queued = [
            Demand(j.gpus, j.nodes, j.est_runtime_s)
            for j in scheduler.queued.values()
            if j.gpus <= self.gpus_per_node
        ]
        ahead = self.settings.oracle_lookahead_s
        if ahead > 0:  # jobs due within the lookahead, holding GPUs from now until their end
            lo = bisect.bisect_right(self._submits, t)
            hi = bisect.bisect_right(self._submits, t + ahead)
            queued += [
                Demand(j.gpus, j.nodes, j.submit - t + j.duration)
                for j in sim.jobs[lo:hi]
                if j.gpus <= self.gpus_per_node
            ]
        d = self.autoscaler.decide(t, self.gpu_model, nodes, queued, pending)
        self.decisions += 1
        if d.cancel:
            self._cancel(sim, t, d.cancel)
        for _ in range(d.provision):
            self._seq += 1
            node = Node(f"auto{self._seq:05d}", self.gpus_per_node, self.gpu_model)
            ready = t + self.settings.provision_lag_s
            sim.add_node_at(ready, node, requested_at=t)
            self.coming[node.name] = ready
        for name in d.terminate:
            sim.remove_node_at(t, name)
            self.idle_since.pop(name, None)
        for name in d.drain:
            sim.remove_node_at(t, name)
        self.provisioned += d.provision
        self.terminated += len(d.terminate)
        self.drained += len(d.drain)
        self._arriving(sim, t)
        live = len(view.capacity) - len(d.terminate) + len(self.coming)
        self.peak_nodes = max(self.peak_nodes, live)

    def _cancel(self, sim: Any, t: float, count: int) -> None:
        """Give back the `count` booting nodes due last: their NODE_UP events go (turned into
        no-op WAKEs) and billing stops now (a provider can cancel a pending request)."""
        names = sorted(self.coming, key=lambda n: self.coming[n], reverse=True)[:count]
        gone = set(names)
        events = sim.events
        for i, (when, kind, seq, payload) in enumerate(events):
            if kind == NODE_UP and getattr(payload, "name", None) in gone:
                events[i] = (when, WAKE, seq, None)
        heapq.heapify(events)
        for name in names:
            del self.coming[name]
            sim.billing[name][2] = t
        self.cancelled += len(names)

    def _arriving(self, sim: Any, t: float) -> None:
        """The booting nodes, as the dispatcher passes pending provisions to the policy: a tier
        with `preempt_wait_s` waits for them instead of preempting (after every pass, so a node
        that is up no longer counts as coming)."""
        arriving = [
            ArrivingNode(ready, self.gpu_model, self.gpus_per_node)
            for ready in self.coming.values()
            if ready > t
        ]
        if arriving or sim.scheduler.arriving:
            sim.scheduler.arriving = arriving

    def summary(self) -> dict[str, Any]:
        return {
            "mode": self.settings.mode,
            "provision_lag_s": self.settings.provision_lag_s,
            "min_nodes": self.settings.min_nodes,
            "max_nodes": self.settings.max_nodes,
            "cooldown_s": self.settings.cooldown_s,
            "interval_s": self.settings.interval_s,
            "burst_share": self.settings.burst_share,
            "momentum_share": self.settings.momentum_share,
            "unused_cooldown_s": self.settings.unused_cooldown_s,
            "spare_nodes": self.settings.spare_nodes,
            "cancel_booting": self.settings.cancel_booting,
            "decide_on_arrival": self.settings.decide_on_arrival,
            "nodes_cancelled": self.cancelled,
            "oracle_lookahead_s": self.settings.oracle_lookahead_s,
            "unwanted_cooldown_s": self.settings.unwanted_cooldown_s,
            "decisions": self.decisions,
            "nodes_provisioned": self.provisioned,
            "nodes_terminated": self.terminated,
            "nodes_drained": self.drained,
            "peak_nodes": self.peak_nodes,
        }
