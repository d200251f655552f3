"""The plan: when each queued job will start, by running the policy's own code forward.

`forecast` takes what a dispatcher pass gives the policy (the cluster, the running and queued
jobs, the tiers, the usage, the held reservations, the nodes being added) and plays the pass
forward in time as the simulator does (apps/scheduling/sim/engine.py): a `Scheduler` is fed
the same state, `decide` is called at each event, and the events are the ends of running and
started jobs at their *predicted* times, the stops of preempted ones, the arrival of nodes being
provisioned and the policy's own wake-ups. The policy still sees what it sees in a real pass (its
running jobs end by their limits, `est_runtime_s` of a queued job is its limit): only the world
around it ends jobs earlier, as history predicts. So a start the plan gives is the start the
policy would make if every job ran its predicted length and nothing new arrived.

Cost is bounded: at most `max_events` passes and `horizon_s` of simulated time; jobs not started
by then have no estimate. The caller runs it once per quantile of the runtime predictor (the
window: an early and a late run) and never per request.

Pure: no Django; times are seconds on the caller's clock.
"""

from __future__ import annotations

import heapq
import math
import statistics
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, replace

from apps.scheduling.core.cluster import ClusterManager
from apps.scheduling.core.model import Node
from apps.scheduling.core.policy.model import (
    ArrivingNode,
    PolicyConfig,
    Preempt,
    QueuedJob,
    RunningJob,
    Start,
    TenantUsage,
    TierPolicy,
)
from apps.scheduling.core.policy.scheduler import Scheduler, busy_beyond_running

_END, _NODE, _ARRIVE, _WAKE = 0, 1, 2, 3
# The runtime predictor's quantiles: the early run, the estimate, the late run (the window), and
# how many runs of a kind it needs before they predict. The platform's plan
# (apps/scheduling/plan.py) and the simulator's score of it (sim/plan_error.py) share them.
QUANTILES = (0.1, 0.5, 0.9)
MIN_RUNS = 3


@dataclass(frozen=True, slots=True)
class Plan:
    """The forecast's answer: `starts` {job_id: start}, `ready` {job_id: when the node it starts
    on was added} for the jobs that start on a node being provisioned, and whether it stopped
    at its bounds before every job started (`cut`)."""

    starts: dict[str, float]
    on_new_node: dict[str, float]
    cut: bool
    order: tuple[str, ...] = ()  # the queued jobs in the policy's order at `now`


def copy_cluster(cluster: ClusterManager, strategy: str | None = None) -> ClusterManager:
    """A ClusterManager with the same nodes (cordons, GPU health) and pods, for a forecast to
    change freely. O(nodes + pods)."""
    copy = ClusterManager(strategy)
    for node in cluster.list_nodes():
        copy.add_node(node)
        view = cluster.node_view(node.name)
        for index, healthy in enumerate(view.healthy):
            if not healthy:
                copy.set_gpu_health(node.name, index, False)
        if view.cordoned:
            copy.cordon(node.name)
    pods = []
    for pod in cluster.list_pods():
        placement = cluster.placement_of(pod.name)
        if placement is not None:
            pods.append((pod, placement))
    copy.add_pods(pods)
    return copy


def forecast(
    now: float,
    cluster: ClusterManager,
    queued: Iterable[QueuedJob],
    running: Iterable[RunningJob],
    tiers: Mapping[str, TierPolicy],
    tenant_usage: Mapping[str, TenantUsage] | None = None,
    *,
    end_of: Callable[[RunningJob], float],
    runtime_of: Callable[[QueuedJob], float],
    config: PolicyConfig | None = None,
    held_reservation: Iterable[str] = (),
    arriving: Iterable[ArrivingNode] = (),
    max_events: int = 60,
    horizon_s: float = 14 * 86400.0,
    strategy: str | None = None,
    until: str | None = None,
    expected: Iterable[QueuedJob] = (),
) -> Plan:
    """Each queued job's start if running jobs end at `end_of(job)` and each started job runs
    `runtime_of(job)` (see the module doc). `cluster` is copied, never changed. `until`: stop
    once that job has started (a caller that wants one job's start). `expected`: jobs expected
    to arrive later (`expected_arrivals`), each submitted at its `submit` time; they get no
    start of their own in the plan but take their place in the policy's order."""
    world = copy_cluster(cluster, strategy)
    scheduler = Scheduler(world, tiers, config)
    for node in world.list_nodes():
        scheduler.add_node(node, in_cluster=True)
    events: list[tuple[float, int, int, object]] = []
    seq = 0

    def push(t: float, kind: int, payload: object) -> None:
        nonlocal seq
        seq += 1
        heapq.heappush(events, (t, kind, seq, payload))

    for held in [replace(job) for job in running]:  # copies: the scheduler changes them
        scheduler.restore_running(held)
        push(max(now, min(end_of(held), held.est_end)), _END, held.job_id)
    busy_beyond_running(scheduler, world)
    scheduler.reset_usage(now)
    for tenant, usage in (tenant_usage or {}).items():
        scheduler.set_usage(tenant, usage.tier, usage.gpu_seconds, now)
    queue = {job.job_id: job for job in queued}
    for job in queue.values():
        scheduler.submit(replace(job))
    scheduler.hold(list(held_reservation))
    phantoms = {job.job_id: job for job in expected if job.job_id not in queue}
    for job in phantoms.values():
        push(max(now, job.submit), _ARRIVE, job)
    order = tuple(job.job_id for job in scheduler._order(now))
    pending_nodes = sorted(arriving, key=lambda coming: coming.ready_at)
    for number, coming in enumerate(pending_nodes):
        push(max(now, coming.ready_at), _NODE, (f"arriving-{number}", coming))
    scheduler.arriving = list(pending_nodes)
    starts: dict[str, float] = {}
    on_new_node: dict[str, float] = {}
    added: dict[str, float] = {}  # an arrived node's name -> when it came
    t, passes = now, 0
    while passes < max_events and t - now <= horizon_s:
        passes += 1
        for decision in scheduler.decide(t):
            if isinstance(decision, Start) and decision.job_id in phantoms:
                push(t + max(0.0, runtime_of(phantoms[decision.job_id])), _END, decision.job_id)
            elif isinstance(decision, Start) and decision.job_id in queue:
                starts[decision.job_id] = t
                new = [added[a.node] for a in decision.placement.assignments if a.node in added]
                if new:
                    on_new_node[decision.job_id] = max(new)
                push(t + max(0.0, runtime_of(queue[decision.job_id])), _END, decision.job_id)
            elif isinstance(decision, Preempt):
                for victim in decision.victim_ids:
                    push(t + scheduler.config.grace_s, _END, victim)
        if len(starts) == len(queue) or (until is not None and until in starts):
            break
        wake = scheduler.wake_at
        if t < wake < math.inf:
            push(wake, _WAKE, None)
        if not events:
            break
        t = max(t, events[0][0])
        while events and events[0][0] <= t:
            _, kind, _, payload = heapq.heappop(events)
            if kind == _END and payload in scheduler.running:
                scheduler.finish(str(payload), t)
            elif kind == _ARRIVE and isinstance(payload, QueuedJob):
                scheduler.submit(replace(payload))
            elif kind == _NODE and isinstance(payload, tuple):
                name, arrived = payload
                scheduler.add_node(Node(str(name), arrived.gpus, arrived.gpu_model))
                added[str(name)] = t
                scheduler.arriving = [n for n in scheduler.arriving if n is not arrived]
    return Plan(starts, on_new_node, cut=len(starts) < len(queue), order=order)


def expected_arrivals(
    now: float, recent: Iterable[QueuedJob], window_s: float, horizon_s: float, max_jobs: int
) -> list[QueuedJob]:
    """The arrivals a plan expects: the jobs submitted in the last `window_s` (`recent`, their
    `submit` times in (now - window_s, now]) arriving again, shifted by window_s, 2 window_s, ...
    up to `horizon_s` ahead, at most `max_jobs` (the earliest). An arrival rate and mix of the
    recent past, with the tenants and tiers that came; each copy has its own id."""
    past = sorted((job for job in recent if now - window_s < job.submit <= now),
                  key=lambda job: job.submit)  # fmt: skip
    out: list[QueuedJob] = []
    if not past or window_s <= 0:
        return out
    for k in range(1, int(horizon_s // window_s) + 2):
        for job in past:
            at = job.submit + k * window_s
            if at - now > horizon_s or len(out) >= max_jobs:
                return out
            out.append(replace(job, job_id=f"{job.job_id}~{k}", submit=at, seq=-1))
    return out


# A job that has run longer than every run the history holds: it is expected to run about as long
# again (the Lindy rule), a quarter of that early, three times that late.
SURVIVOR = {True: 0.25, False: 3.0}


def beyond_history(q: float, elapsed: float) -> float:
    """How much longer a job runs at quantile q once it outlived all the history it has."""
    factor = 1.0 if q == 0.5 else SURVIVOR[q < 0.5]
    return max(60.0, factor * elapsed)


def typical(samples: list[float], q: float) -> float:
    """The run length the plan gives at quantile q: the q-quantile, but the mean for the middle
    run. The queue ahead of a job drains at the mean of its run lengths, which in a heavy-tailed
    history is far above the median (docs/scheduling-fairness-log.md, "Start estimates")."""
    if q == QUANTILES[1]:
        return statistics.fmean(samples)
    return quantile(samples, q)


def quantile(samples: list[float], q: float) -> float:
    """The q-quantile (0..1) of sorted `samples` by linear interpolation."""
    if not samples:
        raise ValueError("no samples")
    if len(samples) == 1:
        return samples[0]
    at = q * (len(samples) - 1)
    low = int(at)
    high = min(low + 1, len(samples) - 1)
    return samples[low] + (samples[high] - samples[low]) * (at - low)


__all__ = [
    "MIN_RUNS",
    "QUANTILES",
    "beyond_history",
    "Plan",
    "copy_cluster",
    "expected_arrivals",
    "forecast",
    "quantile",
    "typical",
]
