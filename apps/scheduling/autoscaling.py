"""The autoscaler in the running platform: read the fleet and the queue, ask the pure core
(apps.scheduling.core.autoscale) per SKU, and carry out its decisions through the provider.

Runs as a beat task on the control queue (`scheduling.autoscale`), one pass at a time (leader
lock). The forecaster's state lives in this process; after a restart it learns again from the
job history of the last day.
"""

from __future__ import annotations

import logging
from datetime import timedelta

from celery import shared_task
from django.db.models import Count, Q
from django.utils import timezone

from apps.jobs.models import ATTEMPT_ACTIVE, AttemptMember, Job, JobState
from apps.nodes.models import Node, NodeState
from apps.nodes.services import node_set_state
from apps.platform.names import Task
from apps.scheduling.core import autoscale as core
from apps.scheduling.models import AutoscaleMode, AutoscalePolicy, ScaleEvent
from apps.scheduling.providers import get_provider
from apps.scheduling.redis import LeaderLock

log = logging.getLogger(__name__)
_scalers: dict[tuple, core.Autoscaler] = {}


def scaler_for(policy: AutoscalePolicy) -> core.Autoscaler:
    limits = core.SkuLimits(
        gpus_per_node=policy.gpus_per_node, min_nodes=policy.min_nodes, max_nodes=policy.max_nodes,
        cooldown_s=float(policy.cooldown_seconds), gpu_hour_budget=policy.gpu_hour_budget,
    )  # fmt: skip
    key = (policy.sku.name, policy.mode, limits, policy.provision_lag_seconds)
    if key not in _scalers:
        scaler = core.Autoscaler(
            {policy.sku.name: limits},
            mode=policy.mode,
            provision_lag_s=policy.provision_lag_seconds,
        )
        _learn_history(scaler, policy)
        _scalers[key] = scaler
    return _scalers[key]


def _learn_history(scaler: core.Autoscaler, policy: AutoscalePolicy) -> None:
    since = timezone.now() - timedelta(days=1)
    for created, gpus, nodes in Job.objects.filter(
        gpu_sku=policy.sku, created_at__gte=since
    ).values_list("created_at", "gpus", "nodes"):
        scaler.observe_arrival(policy.sku.name, created.timestamp(), core.Demand(gpus, nodes))


def fleet(policy: AutoscalePolicy, now) -> list[core.NodeStatus]:
    """The SKU's nodes as the core sees them: free GPUs, idle since when, what frees when."""
    nodes = (
        Node.objects.filter(sku=policy.sku)
        .exclude(state__in=[NodeState.LOST, NodeState.TERMINATED])
        .annotate(gpu_count=Count("gpus", distinct=True))
    )
    members = AttemptMember.objects.filter(
        node__in=nodes, ended_at=None, attempt__state__in=ATTEMPT_ACTIVE
    ).select_related("attempt__job__tier")
    busy: dict[int, list] = {}
    for member in members:
        busy.setdefault(member.node_id, []).append(member)
    statuses = []
    for node in nodes:
        running = busy.get(node.pk, [])
        used = sum(len(m.gpu_indices) for m in running)
        freeing = tuple(
            (
                (m.attempt.started_at or now).timestamp() + m.attempt.job.max_runtime_seconds,
                len(m.gpu_indices),
            )
            for m in running
        )
        idle_since, ever_used = (None, True) if running else _idle_since(node)
        statuses.append(
            core.NodeStatus(
                name=node.name, gpus=node.gpu_count, free_gpus=max(0, node.gpu_count - used),
                idle_since=idle_since.timestamp() if idle_since else None, never_used=not ever_used,
                preemptible_only=bool(running) and all(m.attempt.job.tier.preemptible for m in running),
                draining=node.state == NodeState.DRAINING, freeing=freeing,
            )
        )  # fmt: skip
    return statuses


def _idle_since(node: Node):
    """(idle since, whether it ever ran something): an idle node's last member ended then."""
    last = (
        AttemptMember.objects.filter(node=node).exclude(ended_at=None).order_by("-ended_at").first()
    )
    return max(
        filter(None, [node.registered_at, last.ended_at if last else None])
    ), last is not None


def demand(policy: AutoscalePolicy) -> list[core.Demand]:
    # A job held by its dependencies wants no GPU yet (docs/pipelines.md).
    queued = Job.objects.filter(state=JobState.QUEUED, held_by_dependencies=False).filter(
        Q(gpu_sku=policy.sku)
    )
    return [
        core.Demand(gpus=j.gpus, nodes=j.nodes, est_runtime_s=float(j.max_runtime_seconds))
        for j in queued
    ]


def autoscale_once() -> list[ScaleEvent]:
    provider = get_provider()
    provider.advance()
    events = []
    now = timezone.now()
    for policy in AutoscalePolicy.objects.exclude(mode=AutoscaleMode.OFF).select_related("sku"):
        scaler = scaler_for(policy)
        pending = [
            core.Pending(count=1, ready_at=r.ready_at.timestamp()) for r in provider.pending(policy)
        ]
        decision = scaler.decide(
            now.timestamp(), policy.sku.name, fleet(policy, now), demand(policy), pending
        )
        events.append(_apply(policy, provider, decision))
    return events


def _apply(policy: AutoscalePolicy, provider, decision: core.ScaleDecision) -> ScaleEvent:
    if decision.provision:
        provider.provision(policy, decision.provision)
    for name in decision.drain:
        node = Node.objects.get(name=name)
        if node.state != NodeState.DRAINING:
            node_set_state(node=node, state=NodeState.DRAINING)
    for name in decision.terminate:
        provider.terminate(Node.objects.get(name=name))
    last = ScaleEvent.objects.filter(sku=policy.sku).first()
    changed = decision.provision or decision.drain or decision.terminate
    if (
        changed
        or last is None
        or (last.desired, last.reason) != (decision.desired, decision.reason[:500])
    ):
        last = ScaleEvent.objects.create(
            sku=policy.sku, current=decision.current, pending=decision.pending, desired=decision.desired,
            provision=decision.provision, drain=list(decision.drain), terminate=list(decision.terminate),
            reason=decision.reason[:500],
        )  # fmt: skip
        if changed:
            log.info("autoscale %s: %s", policy.sku, decision)
    return last


@shared_task(name=Task.AUTOSCALE, ignore_result=True)
def autoscale_tick() -> None:
    lock = LeaderLock("autoscale", ttl_ms=60_000)
    try:
        if not lock.acquire():
            return
    except Exception:
        log.warning("redis unavailable: skipping this autoscale pass")
        return
    try:
        autoscale_once()
    finally:
        lock.release()


def pool_shapes() -> list:
    """The node shapes the autoscale policies may add (apps/admission/fit.py's `pools_from`):
    a submit only those could fit is not refused."""
    from apps.admission.fit import AUTOSCALED, Shape

    return [
        Shape(sku, gpus, AUTOSCALED, labels or {})
        for sku, gpus, labels in AutoscalePolicy.objects.exclude(mode=AutoscaleMode.OFF)
        .filter(max_nodes__gt=0)
        .values_list("sku__name", "gpus_per_node", "labels")
    ]
