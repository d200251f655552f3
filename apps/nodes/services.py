"""What node agents do to the fleet records: register, heartbeat; and what the reconcile tick
does when they go quiet."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from datetime import timedelta

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from apps.nodes.models import Gpu, GpuSku, Node, NodeState
from apps.platform.agent_protocol import GpuInfo

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class NodeInfo:
    name: str
    sku: str
    gpus: list[GpuInfo]
    labels: dict = field(default_factory=dict)
    hostname: str = ""
    isolation: str = "none"  # how the agent fences jobs (workers/isolation.py); "none": it cannot


@transaction.atomic
def node_register(*, info: NodeInfo, agent_instance: str) -> Node:
    """Create or update the node and its GPUs. A new agent instance on a known node means the
    previous agent died: whatever it was running is lost (the new agent kills the orphans)."""
    sku, _ = GpuSku.objects.get_or_create(name=info.sku, defaults={"memory_mib": max((g.memory_mib for g in info.gpus), default=0)})
    node, created = Node.objects.select_for_update().get_or_create(
        name=info.name, defaults={"sku": sku, "labels": info.labels, "hostname": info.hostname}
    )
    node.isolation = info.isolation[:64] or "none"
    previous_instance = node.agent_instance
    node.sku, node.labels, node.hostname = sku, info.labels, info.hostname
    node.agent_instance = agent_instance
    node.last_heartbeat_at = timezone.now()
    if node.state == NodeState.LOST:
        node.state = NodeState.READY
    node.version += 1
    node.save()
    _sync_gpus(node, info.gpus)
    if not created and previous_instance and previous_instance != agent_instance:
        _lose_attempts_on(node, reason=f"agent on {node.name} restarted")
    from apps.jobs.services import trigger_dispatch

    trigger_dispatch()
    return node


def _sync_gpus(node: Node, gpus: list[GpuInfo]) -> None:
    seen = set()
    for info in gpus:
        seen.add(info.index)
        Gpu.objects.update_or_create(
            node=node, index=info.index,
            defaults={"uuid": info.uuid, "memory_mib": info.memory_mib, "health": _health(info)},
        )  # fmt: skip
    for gone in node.gpus.exclude(index__in=seen):
        gone.health = "unhealthy"
        gone.save(update_fields=["health", "updated_at"])


def _health(info: GpuInfo) -> str:
    return "healthy" if info.healthy else "unhealthy"


def node_heartbeat(*, name: str, agent_instance: str, gpus: list[GpuInfo]) -> Node | None:
    """Record that the agent is alive and how its GPUs are. Returns None if another agent
    instance has taken the node over (this one must stop)."""
    now = timezone.now()
    with transaction.atomic():
        node = Node.objects.select_for_update().filter(name=name).first()
        if node is None or node.agent_instance != agent_instance:
            return None
        came_back = node.state == NodeState.LOST
        node.last_heartbeat_at = now
        if came_back:
            node.state = NodeState.READY
        node.save(update_fields=["last_heartbeat_at", "state"])
        for info in gpus:
            Gpu.objects.filter(node=node, index=info.index).update(
                health=_health(info), utilization_percent=info.utilization_percent,
                memory_used_mib=info.memory_used_mib, updated_at=now,
            )  # fmt: skip
        _renew_leases(node, now)
    if came_back:
        from apps.jobs.services import trigger_dispatch

        log.info("node %s is back", name)
        with transaction.atomic():
            trigger_dispatch()
    return node


def _renew_leases(node: Node, now) -> None:
    from apps.jobs.models import AttemptState, JobAttempt

    lease = now + timedelta(seconds=settings.HEARTBEAT_SECONDS * settings.NODE_LOST_AFTER_HEARTBEATS)
    # Only attempts with a member still running here: one whose members all ended must not be
    # kept alive by the heartbeat (reconcile settles it).
    JobAttempt.objects.filter(
        state__in=[AttemptState.RUNNING, AttemptState.PREEMPTING], members__node=node, members__ended_at=None
    ).update(lease_expires_at=lease)


def lost_cutoff():
    return timezone.now() - timedelta(seconds=settings.HEARTBEAT_SECONDS * settings.NODE_LOST_AFTER_HEARTBEATS)


def mark_silent_nodes_lost() -> list[str]:
    """Nodes whose agent has not heartbeated for N intervals are lost; their attempts requeued."""
    lost = []
    silent = Node.objects.exclude(state__in=[NodeState.LOST, NodeState.TERMINATED]).filter(
        last_heartbeat_at__lt=lost_cutoff()
    )
    for node in silent:
        with transaction.atomic():
            updated = Node.objects.filter(pk=node.pk, version=node.version).update(
                state=NodeState.LOST, version=node.version + 1
            )
            if not updated:
                continue
            node.state = NodeState.LOST
            log.warning("node %s lost: no heartbeat since %s", node.name, node.last_heartbeat_at)
            _lose_attempts_on(node, reason=f"node {node.name} lost (no heartbeat)")
            lost.append(node.name)
    return lost


def _lose_attempts_on(node: Node, *, reason: str) -> None:
    from apps.jobs.models import ATTEMPT_ACTIVE, AttemptMember, GpuAllocation, JobAttempt
    from apps.jobs.services import attempt_lost

    now = timezone.now()
    attempts = JobAttempt.objects.filter(members__node=node, members__ended_at=None).distinct()
    for attempt in attempts:
        # This node's members are gone with their agent: end them and free their GPUs here.
        AttemptMember.objects.filter(attempt=attempt, node=node, ended_at=None).update(state="lost", ended_at=now)
        GpuAllocation.objects.filter(attempt=attempt, gpu__node=node, released_at=None).update(released_at=now)
        if attempt.state in ATTEMPT_ACTIVE:
            attempt_lost(attempt=attempt, reason=reason, actor="system:reconcile")


def node_set_state(*, node: Node, state: str, drain_seconds: float | None = None) -> Node:
    """Support staff: cordon (no new placements), drain (no new placements; what still runs after
    `drain_seconds` is preempted and resumes elsewhere), or return a node to service."""
    deadline = None
    if state == NodeState.DRAINING:
        seconds = settings.DRAIN_DEADLINE_SECONDS if drain_seconds is None else drain_seconds
        deadline = timezone.now() + timedelta(seconds=seconds)
    Node.objects.filter(pk=node.pk).update(state=state, version=node.version + 1, drain_deadline=deadline)
    node.refresh_from_db()
    return node


def preempt_past_drain_deadline() -> list[str]:
    """Jobs still on a draining node after its deadline are preempted (checkpoint, requeue)."""
    from apps.jobs.models import AttemptState, Job
    from apps.jobs.services import ServiceError, job_preempt

    preempted = []
    overdue = Node.objects.filter(state=NodeState.DRAINING, drain_deadline__lt=timezone.now())
    jobs = Job.objects.filter(
        attempts__state__in=[AttemptState.STARTING, AttemptState.RUNNING],
        attempts__members__node__in=overdue,
        attempts__members__ended_at=None,
    ).distinct()
    for job in jobs:
        try:
            job_preempt(job=job, actor="system:reconcile", reason="its node is drained")
            preempted.append(str(job.pk))
        except ServiceError:
            continue  # it ended or moved meanwhile
    return preempted
