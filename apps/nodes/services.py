"""What node agents do to the fleet records: register, heartbeat; and what the reconcile tick
does when they go quiet.

Nodes sit below jobs: what a node's change means for the attempts on it (lost, preempted) is
said as an event (NodeLost, DrainOverdue) that apps/jobs handles in the same transaction."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from datetime import timedelta

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from apps.nodes.models import Gpu, GpuSku, Node, NodeState
from apps.platform import events
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
    sku, _ = GpuSku.objects.get_or_create(
        name=info.sku, defaults={"memory_mib": max((g.memory_mib for g in info.gpus), default=0)}
    )
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
    events.emit(events.DispatchWanted())
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
        log.info("node %s is back", name)
        with transaction.atomic():
            events.emit(events.DispatchWanted())
    return node


def _renew_leases(node: Node, now) -> None:
    """The attempts running here keep their leases (apps/jobs/handlers.py, in this transaction)."""
    lease = now + timedelta(
        seconds=settings.HEARTBEAT_SECONDS * settings.NODE_LOST_AFTER_HEARTBEATS
    )
    events.emit(events.NodeAlive(node_id=node.pk, lease_until=lease))


def lost_cutoff():
    return timezone.now() - timedelta(
        seconds=settings.HEARTBEAT_SECONDS * settings.NODE_LOST_AFTER_HEARTBEATS
    )


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
    """What ran on the node is lost with its agent (apps/jobs/handlers.py, in this transaction)."""
    events.emit(events.NodeLost(node_id=node.pk, reason=reason))


def node_set_state(*, node: Node, state: str, drain_seconds: float | None = None) -> Node:
    """Support staff: cordon (no new placements), drain (no new placements; what still runs after
    `drain_seconds` is preempted and resumes elsewhere), or return a node to service."""
    deadline = None
    if state == NodeState.DRAINING:
        seconds = settings.DRAIN_DEADLINE_SECONDS if drain_seconds is None else drain_seconds
        deadline = timezone.now() + timedelta(seconds=seconds)
    Node.objects.filter(pk=node.pk).update(
        state=state, version=node.version + 1, drain_deadline=deadline
    )
    node.refresh_from_db()
    return node


def preempt_past_drain_deadline() -> list[str]:
    """Jobs still on a draining node after its deadline are preempted (checkpoint, requeue):
    the ids of those preempted (apps/jobs/handlers.py answers DrainOverdue)."""
    overdue = Node.objects.filter(state=NodeState.DRAINING, drain_deadline__lt=timezone.now())
    node_ids = tuple(overdue.values_list("pk", flat=True))
    if not node_ids:
        return []
    answers = events.emit(events.DrainOverdue(node_ids=node_ids))
    return [job_id for preempted in answers for job_id in preempted]
