"""The dispatcher: load the cluster and the queue from the database, ask the pure core where
each job goes, and apply each placement as a guarded update (see apps.jobs.services.job_place).

First version of the policy (kept behind `ordered_queue`): strict tier order, then submit time;
a job that does not fit is skipped, with the core's explanation as its `reason`.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field

from django.db import IntegrityError
from django.db.models import Q

from apps.jobs.models import GpuAllocation, Job, JobState
from apps.jobs.services import MemberPlacement, job_place
from apps.nodes.models import GpuHealth, Node, NodeState
from apps.scheduling import core

log = logging.getLogger(__name__)
QUEUE_SCAN_LIMIT = 1000  # jobs looked at per pass; the rest wait for the next one
HELD = "held:"  # pseudo-pods standing for the GPUs that attempts hold


@dataclass
class DispatchResult:
    placed: list[str] = field(default_factory=list)
    waiting: int = 0
    seconds: float = 0.0


@dataclass
class ClusterSnapshot:
    cluster: core.ClusterManager
    gpu_ids: dict[tuple[str, int], int]  # (node name, GPU index) -> Gpu pk
    node_ids: dict[str, int]


def load_cluster(strategy: str = "best-fit") -> ClusterSnapshot:
    """The ready nodes with every allocated or unhealthy GPU marked taken."""
    cluster = core.ClusterManager(strategy=strategy)
    held = set(GpuAllocation.objects.filter(released_at=None).values_list("gpu_id", flat=True))
    gpu_ids, node_ids = {}, {}
    nodes = Node.objects.filter(state=NodeState.READY).select_related("sku").prefetch_related("gpus")
    for node in nodes:
        gpus = {gpu.index: gpu for gpu in node.gpus.all()}
        size = max(gpus, default=-1) + 1
        cluster.add_node(core.Node(name=node.name, gpus=size, gpu_model=node.sku.name, labels=node.labels))
        node_ids[node.name] = node.pk
        held_here = []
        for index in range(size):
            gpu = gpus.get(index)
            if gpu is None or gpu.health != GpuHealth.HEALTHY:
                cluster.set_gpu_health(node.name, index, False)
            elif gpu.pk in held:
                held_here.append(index)
            if gpu is not None:
                gpu_ids[(node.name, index)] = gpu.pk
        if held_here:
            assignment = core.Assignment(node=node.name, gpu_indices=held_here, gpu_milli=[core.MILLI] * len(held_here))
            cluster.add_pod(
                core.Pod(name=HELD + node.name, gpus=len(held_here), gpu_models=(node.sku.name,)),
                core.Placement(assignments=[assignment]),
            )
    return ClusterSnapshot(cluster=cluster, gpu_ids=gpu_ids, node_ids=node_ids)


def ordered_queue():
    """Queued jobs in the order the first-version policy serves them."""
    return (
        Job.objects.filter(state=JobState.QUEUED)
        .select_related("tier", "gpu_sku")
        .order_by("-tier__level", "-tier__rank", "-priority_boost", "created_at")[:QUEUE_SCAN_LIMIT]
    )


def pod_for(job: Job) -> core.Pod:
    return core.Pod(
        name=str(job.id),
        gpus=job.gpus,
        gpu_models=(job.gpu_sku.name,) if job.gpu_sku_id else (),
        node_selector=job.node_selector or {},
        nodes=job.nodes,
    )


def dispatch_once() -> DispatchResult:
    started = time.monotonic()
    result = DispatchResult()
    snapshot = load_cluster()
    for job in ordered_queue():
        pod = pod_for(job)
        placement = snapshot.cluster.schedule_pod(pod)
        if placement is None:
            result.waiting += 1
            _explain_wait(job, snapshot.cluster.why_not(pod))
            continue
        if _apply(job, placement, snapshot):
            result.placed.append(str(job.id))
        else:
            snapshot.cluster.remove_pod(pod.name)
    result.seconds = time.monotonic() - started
    if result.placed:
        log.info("dispatch placed %d jobs, %d waiting, %.3fs", len(result.placed), result.waiting, result.seconds)
    return result


def _apply(job: Job, placement, snapshot: ClusterSnapshot) -> bool:
    members = [
        MemberPlacement(
            node_id=snapshot.node_ids[a.node],
            gpu_ids=[snapshot.gpu_ids[(a.node, i)] for i in a.gpu_indices],
            gpu_indices=list(a.gpu_indices),
        )
        for a in placement.assignments
    ]
    try:
        return job_place(job=job, members=members) is not None
    except IntegrityError:
        # Another dispatcher took one of these GPUs first: the database said no.
        log.info("placement of %s lost a race for its GPUs; retrying next pass", job.id)
        return False


def _explain_wait(job: Job, why: str) -> None:
    reason = f"waiting: {why}"[:300] if why else "waiting for free GPUs"
    if job.reason != reason:
        Job.objects.filter(pk=job.pk, state=JobState.QUEUED, version=job.version).update(reason=reason)


def queue_position(job: Job) -> int | None:
    """1-based position among queued jobs in dispatch order."""
    if job.state != JobState.QUEUED:
        return None
    return Job.objects.filter(state=JobState.QUEUED).filter(_ahead_filter(job)).count() + 1


def _ahead_filter(job: Job) -> Q:
    tier = job.tier
    higher_level = Q(tier__level__gt=tier.level)
    higher_rank = Q(tier__level=tier.level, tier__rank__gt=tier.rank)
    same_tier_earlier = Q(tier__level=tier.level, tier__rank=tier.rank, created_at__lt=job.created_at)
    return higher_level | higher_rank | same_tier_earlier
