"""The autoscaler: how many nodes each GPU SKU should have, planned around provisioning lag.

Plain data in, plain decisions out (no Django): the dispatcher, the simulator and the local demo
provider run this same code. Per SKU, one `decide` call:

1. **Reactive demand.** The queued shapes (a gang is `nodes` members of `gpus` each) are packed,
   largest first, onto what will be free by the time a new node could arrive: free GPUs now,
   GPUs of running jobs expected to end within the provisioning lag, and nodes already being
   provisioned. Members that still do not fit are packed into whole new nodes (first-fit
   decreasing), so a gang of 4 x 8 GPUs asks for 4 nodes, never 32 GPUs' worth of fractions.
   A burst that the capacity freeing within the lag absorbs asks for nothing.
2. **Forecast** (mode `predictive`): the GPU demand expected to arrive during the lag, from
   exponential smoothing of arrivals with a daily season (`Forecaster`), is added to what waits
   now, minus the GPUs that will still be spare after the queue is served.
3. **Scale-down.** A node idle past `cooldown_s` may go; nodes that run nothing go first, then
   nodes that run only preemptible work (they are drained: no new work, running jobs finish or are
   preempted after the drain deadline). A node with non-preemptible work is never removed.
4. **Hysteresis.** Up at once (late capacity is the expensive mistake); down only to the highest
   desired count seen over the last `cooldown_s`, and never within `cooldown_s` of scaling up,
   so a sawtooth load does not flap.
5. **Limits.** `min_nodes`..`max_nodes` per SKU and a GPU-hour budget per period (no scale-up
   that the remaining budget cannot pay for over `budget_horizon_s`).

Options, default off: `cancel_booting` (give back booting nodes nothing wants any more,
`ScaleDecision.cancel`), `spare_nodes` (predictive: keep whole nodes free at the horizon) and
`SkuLimits.unwanted_cooldown_s` (any idle node the target does not want goes after that long).

Every decision carries its reason. Complexity per call: O(Q log Q + N) for Q queued members and N
nodes of the SKU.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

DAY = 86400.0
MAX_MEMBERS = 5000  # queued gang members looked at per SKU and call


class _Timeline:
    """Free GPUs of one node over time: a start value and (time, +/- GPUs) steps."""

    __slots__ = ("free", "steps", "gangs")

    def __init__(self, free_now: int, freeing: Iterable[tuple[float, int]]) -> None:
        self.free = free_now
        self.steps = sorted(freeing)
        self.gangs: set[int] = set()

    def free_at(self, t: float) -> int:
        return self.free + sum(g for when, g in self.steps if when <= t)

    def place(self, gpus: int, now: float, horizon: float, runtime: float, gang: int) -> bool:
        """Start `gpus` for `runtime` at the earliest time <= horizon they stay free; O(S^2)."""
        for start in [now] + [when for when, _ in self.steps if now < when <= horizon]:
            end = start + runtime
            checks = [start] + [when for when, _ in self.steps if start < when < end]
            if all(self.free_at(t) >= gpus for t in checks):
                self.steps.append((start, -gpus))
                if end < math.inf:
                    self.steps.append((end, gpus))
                self.steps.sort()
                self.gangs.add(gang)
                return True
        return False


@dataclass(frozen=True, slots=True)
class SkuLimits:
    gpus_per_node: int
    min_nodes: int = 0
    max_nodes: int = 1_000_000
    cooldown_s: float = 600.0  # idle this long before removal; no scale-down this soon after an up
    gpu_hour_budget: float | None = None  # per period; None: unlimited
    budget_horizon_s: float = 3600.0  # a new node must be affordable for this long
    # A node that has run nothing since it arrived and that the target does not want goes after
    # this long idle, hysteresis or not (it was asked for demand that did not come).
    unused_cooldown_s: float = 60.0
    # If set: any idle node the target does not want (used or not) goes after this long idle,
    # hysteresis or not (None: only never-used nodes go early).
    unwanted_cooldown_s: float | None = None


@dataclass(frozen=True, slots=True)
class Demand:
    """A queued job's shape: `nodes` members of `gpus` GPUs each."""

    gpus: int
    nodes: int = 1
    est_runtime_s: float = math.inf  # how long it will hold its GPUs once started


@dataclass(frozen=True, slots=True)
class NodeStatus:
    name: str
    gpus: int
    free_gpus: int
    idle_since: float | None = None  # None: it runs something
    preemptible_only: bool = False  # everything on it may be preempted
    draining: bool = False
    never_used: bool = False  # has run nothing since it arrived (None idle_since: not true)
    # GPUs that running jobs will free, as (expected end time, gpus)
    freeing: tuple[tuple[float, int], ...] = ()


@dataclass(frozen=True, slots=True)
class Pending:
    """Nodes asked for and not yet arrived."""

    count: int
    ready_at: float


@dataclass(frozen=True, slots=True)
class ScaleDecision:
    sku: str
    current: int
    pending: int
    desired: int
    provision: int = 0  # new nodes to ask the provider for
    drain: tuple[str, ...] = ()  # stop placing work here (then terminate when empty)
    terminate: tuple[str, ...] = ()  # empty and idle: give back now
    reason: str = ""
    cancel: int = 0  # booting nodes to give back before they arrive (latest due first)


class Forecaster:
    """Arrivals of GPU demand per SKU, smoothed: a level (EWMA of the rate) times a daily
    seasonal factor per time-of-day bin (also smoothed). `rate(t)` is GPUs-per-second of new
    demand expected at time t; `expected(t, horizon)` integrates it over the horizon."""

    def __init__(
        self,
        bin_s: float = 900.0,
        alpha: float = 0.3,
        gamma: float = 0.3,
        burst_half_life_s: float = DAY,
        momentum_half_life_s: float = 300.0,
    ) -> None:
        self.bin_s, self.alpha, self.gamma = bin_s, alpha, gamma
        # Arrivals of the last minutes, each weighed 2^(-age / half-life): the pace of a stream
        # (a sweep, a gang series) that a 15-minute bin only sees once it has closed.
        self.momentum_half_life_s = momentum_half_life_s
        self._recent = 0.0
        self._recent_t: float | None = None
        # The highest bin rate seen lately, decaying with this half-life: how big a burst gets.
        self.burst_decay = 0.5 ** (bin_s / burst_half_life_s) if burst_half_life_s > 0 else 0.0
        self.peak_rate = 0.0
        self.bins = max(1, int(DAY // bin_s))
        self.level: float | None = None
        self.season = [1.0] * self.bins
        self._bin: int | None = None
        self._acc = 0.0

    def observe(self, t: float, gpu_demand: float) -> None:
        """Record `gpu_demand` GPUs (gpus x nodes of a job) arriving at time t."""
        self._roll(t)
        self._acc += gpu_demand
        self._decay(t)
        self._recent += gpu_demand

    def _decay(self, t: float) -> None:
        if self._recent_t is not None and t > self._recent_t and self.momentum_half_life_s > 0:
            self._recent *= 0.5 ** ((t - self._recent_t) / self.momentum_half_life_s)
        if self._recent_t is None or t > self._recent_t:
            self._recent_t = t

    def momentum(self, t: float, horizon_s: float) -> float:
        """GPUs of new demand in [t, t + horizon) if arrivals keep their pace of the last
        minutes: the decayed sum R of recent arrivals estimates a rate R ln2 / half-life."""
        if self.momentum_half_life_s <= 0:
            return 0.0
        self._decay(t)
        return self._recent * math.log(2) / self.momentum_half_life_s * horizon_s

    def _roll(self, t: float) -> None:
        index = int(t // self.bin_s)
        if self._bin is None:
            self._bin = index
        while self._bin < index:
            self._close_bin(self._acc / self.bin_s)
            self._acc = 0.0
            self._bin += 1

    def _close_bin(self, rate: float) -> None:
        assert self._bin is not None  # _roll sets it before closing a bin
        slot = self._bin % self.bins
        season = self.season[slot]
        self.peak_rate = max(rate, self.peak_rate * self.burst_decay)
        if self.level is None:
            self.level = 0.0  # start from nothing: one burst must not look like a trend
        deseasoned = rate / season if season > 0 else rate
        self.level = self.alpha * deseasoned + (1 - self.alpha) * self.level
        if self.level > 0:
            ratio = min(10.0, rate / self.level)
            self.season[slot] = self.gamma * ratio + (1 - self.gamma) * season

    def rate(self, t: float) -> float:
        if self.level is None:
            return 0.0
        return self.level * self.season[int(t // self.bin_s) % self.bins]

    def burst(self, t: float, horizon_s: float) -> float:
        """GPUs of new demand a recent burst (the decaying highest bin rate) brings in
        [t, t + horizon)."""
        self._roll(t)
        return self.peak_rate * horizon_s

    def expected(self, t: float, horizon_s: float) -> float:
        """Expected GPUs of new demand arriving in [t, t + horizon)."""
        self._roll(t)
        total, start = 0.0, t
        while start < t + horizon_s:
            end = min(t + horizon_s, (math.floor(start / self.bin_s) + 1) * self.bin_s)
            total += self.rate(start) * (end - start)
            start = end
        return total


@dataclass(frozen=True, slots=True)
class _Spare:
    """What is free at the horizon once the queue is served."""

    gpus: int  # all free GPUs on nodes that are up, booting or asked for by the queue
    whole: int  # nodes with every GPU free
    idle_coming: int  # booting nodes the queue does not use


@dataclass
class _SkuState:
    recent_desired: deque[tuple[float, int]] = field(default_factory=deque)  # (t, desired)
    last_up_at: float = -math.inf
    gpu_hours_used: float = 0.0


class Autoscaler:
    """Desired node counts per SKU. Keeps the little state hysteresis needs between calls."""

    def __init__(
        self,
        limits: Mapping[str, SkuLimits],
        *,
        mode: str = "predictive",
        provision_lag_s: float = 300.0,
        forecaster: Mapping[str, Forecaster] | None = None,
        burst_share: float = 0.0,
        momentum_share: float = 0.0,
        spare_nodes: int = 0,
        cancel_booting: bool = False,
    ) -> None:
        if mode not in ("off", "reactive", "predictive"):
            raise ValueError(f"unknown autoscale mode {mode!r}")
        self.limits = dict(limits)
        self.mode = mode
        self.lag = provision_lag_s
        # predictive: plan for this share of a recent burst on top of the smoothed forecast
        self.burst_share = burst_share
        # predictive: plan for this share of the current stream's pace continuing over the lag
        self.momentum_share = momentum_share
        # predictive: keep at least this many whole nodes free at the horizon (up or booting)
        self.spare_nodes = spare_nodes
        # give back booting nodes that nothing wants any more (billing stops at the cancel)
        self.cancel_booting = cancel_booting
        self.forecast = dict(forecaster or {sku: Forecaster() for sku in self.limits})
        self._state = {sku: _SkuState() for sku in self.limits}

    def observe_arrival(self, sku: str, t: float, demand: Demand) -> None:
        if sku in self.forecast:
            self.forecast[sku].observe(t, demand.gpus * demand.nodes)

    def charge(self, sku: str, gpu_hours: float) -> None:
        """Add paid GPU-hours to this period's budget account."""
        self._state[sku].gpu_hours_used += gpu_hours

    def reset_budget(self, sku: str) -> None:
        self._state[sku].gpu_hours_used = 0.0

    def decide(
        self,
        now: float,
        sku: str,
        nodes: Iterable[NodeStatus],
        queued: Iterable[Demand],
        pending: Iterable[Pending] = (),
    ) -> ScaleDecision:
        limits, state = self.limits[sku], self._state[sku]
        nodes, pending = list(nodes), list(pending)
        active = [n for n in nodes if not n.draining]
        current, coming = len(active), sum(p.count for p in pending)
        if self.mode == "off":
            return ScaleDecision(sku, current, coming, current, reason="autoscaling off")
        used, needed, spare = self._reactive(now, limits, active, queued, pending)
        why = [
            f"{needed} node(s) for queued work"
            if needed
            else "queue fits in capacity freeing within the lag"
        ]
        extra, slack = 0, spare.idle_coming
        if self.mode == "predictive":
            extra, slack = self._predicted(now, sku, limits, spare)
            if extra:
                why.append(f"{extra} node(s) for arrivals forecast over the next {self.lag:.0f}s")
        cancel = 0
        if self.cancel_booting and not needed:
            # idle nodes that are up serve the forecast first: they are there now
            cancel = min(spare.idle_coming, max(0, slack + current - used - extra))
        needed += extra
        if cancel:
            why.append(f"{cancel} booting node(s) no longer wanted: cancelled")
            coming -= cancel
        target = used + coming + needed
        wanted = max(limits.min_nodes, min(limits.max_nodes, target))
        retire = self._unused(now, limits, active, current + coming - wanted)
        if retire:
            why.append(f"{len(retire)} node(s) never used since they arrived and not wanted")
        target = self._hysteresis(now, state, limits, target, current + coming, why)
        target = max(limits.min_nodes, min(limits.max_nodes, target))
        target = max(wanted, target - len(retire))
        provision = max(0, target - current - coming)
        provision = self._afford(state, limits, provision, current + coming, why)
        if provision:
            state.last_up_at = now
        drain, terminate = (
            self._shrink(now, limits, nodes, current + coming - target - len(retire), retire)
            if target < current
            else ((), ())
        )
        terminate = retire + terminate
        if target != current + coming or drain or terminate:
            why.append(f"limits {limits.min_nodes}..{limits.max_nodes}")
        return ScaleDecision(
            sku, current, coming, target, provision, drain, terminate, "; ".join(why), cancel
        )

    # --- the parts ------------------------------------------------------------------------

    def _reactive(
        self,
        now: float,
        limits: SkuLimits,
        nodes: list[NodeStatus],
        queued: Iterable[Demand],
        pending: list[Pending],
    ) -> tuple[int, int, _Spare]:
        """New nodes the queue needs beyond what existing and coming nodes can start before the
        lag is over (free now, freed by running jobs, freed again by queued jobs that finish in
        time); and how many GPUs are spare at the horizon after serving the queue."""
        horizon = now + self.lag
        timelines = [_Timeline(n.free_gpus, n.freeing) for n in nodes]
        timelines += [
            _Timeline(0, ((p.ready_at, limits.gpus_per_node),))
            for p in pending
            for _ in range(p.count)
        ]
        # Members of one gang must land on distinct nodes: each carries its gang's number.
        members = sorted(
            (
                (d.gpus, d.est_runtime_s, gang)
                for gang, d in enumerate(queued)
                for _ in range(d.nodes)
                if d.gpus <= limits.gpus_per_node
            ),
            key=lambda m: (-m[0], m[1]),
        )
        new_nodes: list[list[Any]] = []  # [free GPUs, gangs on it]
        for gpus, runtime, gang in members[:MAX_MEMBERS]:
            if any(
                gang not in t.gangs and t.place(gpus, now, horizon, runtime, gang)
                for t in timelines
            ):
                continue
            for slot in new_nodes:
                if slot[0] >= gpus and gang not in slot[1]:
                    slot[0] -= gpus
                    slot[1].add(gang)
                    break
            else:
                new_nodes.append([limits.gpus_per_node - gpus, {gang}])
        # Existing nodes that run something or take queued work are needed; idle ones are spare.
        used = [
            t for t, n in zip(timelines, nodes, strict=False) if n.idle_since is None or t.gangs
        ]
        # Nodes being provisioned count in the target whole, so what the queue leaves of them at
        # the horizon is spare too (else every call until they arrive asks for the forecast again).
        coming = timelines[len(nodes) :]
        free = [t.free_at(horizon) for t in used + coming] + [s[0] for s in new_nodes]
        whole = sum(f >= limits.gpus_per_node for f in free)
        spare = _Spare(
            gpus=sum(free),
            whole=whole,
            idle_coming=sum(not t.gangs for t in coming),
        )
        return len(used), len(new_nodes), spare

    def _predicted(self, now: float, sku: str, limits: SkuLimits, spare: _Spare) -> tuple[int, int]:
        """New nodes for the forecast, and how many whole nodes are spare beyond it."""
        gpn = limits.gpus_per_node
        forecast = self.forecast.get(sku)
        expected = 0.0
        if forecast is not None:
            expected = forecast.expected(now, self.lag)
            if self.burst_share > 0:
                expected = max(expected, self.burst_share * forecast.burst(now, self.lag))
            if self.momentum_share > 0:
                expected = max(expected, self.momentum_share * forecast.momentum(now, self.lag))
        extra = max(0, math.ceil((expected - spare.gpus) / gpn - 1e-9))
        slack = max(0, math.floor((spare.gpus - expected) / gpn + 1e-9))
        if self.spare_nodes > 0:
            extra = max(extra, self.spare_nodes - spare.whole)
            slack = min(slack, max(0, spare.whole - self.spare_nodes))
        return extra, slack

    def _hysteresis(
        self,
        now: float,
        state: _SkuState,
        limits: SkuLimits,
        target: int,
        have: int,
        why: list[str],
    ) -> int:
        window = state.recent_desired
        window.append((now, target))
        while window and window[0][0] < now - limits.cooldown_s:
            window.popleft()
        if target >= have:
            return target
        if now - state.last_up_at < limits.cooldown_s:
            why.append("holding: scaled up less than the cooldown ago")
            return have
        peak = max(d for _, d in window)
        if peak > target:
            why.append(f"holding at the peak of the last {limits.cooldown_s:.0f}s")
        return min(have, peak)

    def _afford(
        self, state: _SkuState, limits: SkuLimits, provision: int, have: int, why: list[str]
    ) -> int:
        if limits.gpu_hour_budget is None or provision == 0:
            return provision
        left = limits.gpu_hour_budget - state.gpu_hours_used
        per_node = limits.gpus_per_node * limits.budget_horizon_s / 3600.0
        running = have * per_node
        affordable = max(0, int((left - running) // per_node)) if per_node > 0 else provision
        if affordable < provision:
            why.append(f"GPU-hour budget allows {affordable} of {provision} new node(s)")
        return min(provision, affordable)

    def _unused(
        self, now: float, limits: SkuLimits, nodes: list[NodeStatus], surplus: int
    ) -> tuple[str, ...]:
        """Idle nodes that have run nothing since they arrived, past `unused_cooldown_s`, up to
        the surplus over the target before hysteresis (longest idle first)."""
        if surplus <= 0:
            return ()
        unwanted = limits.unwanted_cooldown_s
        unused = [
            n
            for n in nodes
            if n.idle_since is not None
            and (
                (n.never_used and now - n.idle_since >= limits.unused_cooldown_s)
                or (unwanted is not None and now - n.idle_since >= unwanted)
            )
        ]
        return tuple(n.name for n in sorted(unused, key=_idle_since)[:surplus])

    def _shrink(
        self,
        now: float,
        limits: SkuLimits,
        nodes: list[NodeStatus],
        surplus: int,
        gone: tuple[str, ...] = (),
    ) -> tuple[tuple[str, ...], tuple[str, ...]]:
        """Choose which nodes go: idle past the cooldown, empty ones first, then nodes running only
        preemptible work (drained). Never a node with non-preemptible work."""
        if surplus <= 0:
            return (), ()
        idle = [
            n
            for n in nodes
            if n.idle_since is not None
            and now - n.idle_since >= limits.cooldown_s
            and n.name not in gone
        ]
        busy_preemptible = [
            n for n in nodes if n.idle_since is None and n.preemptible_only and not n.draining
        ]
        terminate = tuple(n.name for n in sorted(idle, key=_idle_since)[:surplus])
        left = surplus - len(terminate)
        drain = tuple(
            n.name
            for n in sorted(busy_preemptible, key=lambda n: n.gpus - n.free_gpus)[: max(0, left)]
        )
        return drain, terminate


def _idle_since(node: NodeStatus) -> float:
    """Sort key of a node already filtered to the idle ones."""
    assert node.idle_since is not None
    return node.idle_since
