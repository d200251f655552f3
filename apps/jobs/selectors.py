"""Read-only queries used by node agents: what they should be running."""

from dataclasses import dataclass

from apps.jobs.models import ATTEMPT_ACTIVE, AttemptMember


@dataclass(frozen=True)
class Assignment:
    """Everything a node agent needs to run one member of an attempt."""

    job_id: str
    attempt_id: int
    attempt_number: int
    rank: int
    token: str
    argv: list[str]
    params: dict
    gpu_indices: list[int]
    world_size: int
    master_addr: str
    master_port: int
    max_runtime_seconds: int
    checkpoint: str
    stop_requested: str
    active: bool
    grace_seconds: int = 30  # checkpoint signal -> SIGTERM on preemption
    checkpoint_signal: str = "SIGUSR1"
    # The member's cgroup limits on a fencing node (workers/isolation.py); 0: the node's default
    # (GPUPLATFORM_JOB_MEMORY_MIB, GPUPLATFORM_JOB_PIDS_MAX, GPUPLATFORM_JOB_CPU_WEIGHT). No job,
    # template or tier field feeds them yet.
    memory_mib: int = 0
    pids_max: int = 0
    cpu_weight: int = 0  # cgroup v2 scale, 1..10000 (100 the default)


def assignment_for(member: AttemptMember) -> Assignment:
    attempt = member.attempt
    job = attempt.job
    members = list(attempt.members.select_related("node").order_by("rank"))
    leader = members[0].node
    argv = list(job.template.argv) if job.template_id else list(job.command)
    return Assignment(
        job_id=str(job.pk),
        attempt_id=attempt.pk,
        attempt_number=attempt.number,
        rank=member.rank,
        token=str(attempt.token),
        argv=argv,
        params=job.params,
        gpu_indices=list(member.gpu_indices),
        world_size=len(members),
        master_addr=leader.labels.get("address") or leader.hostname or "127.0.0.1",
        master_port=29500 + attempt.pk % 1000,
        max_runtime_seconds=job.max_runtime_seconds,
        checkpoint=attempt.checkpoint,
        stop_requested=attempt.stop_requested,
        active=attempt.state in ATTEMPT_ACTIVE,
        grace_seconds=job.tier.preemption_grace_seconds,
    )


def assignment(attempt_id: int, rank: int, token: str) -> Assignment | None:
    member = (
        AttemptMember.objects.select_related("attempt__job__template", "attempt__job__tier", "node")
        .filter(attempt_id=attempt_id, rank=rank, attempt__token=token)
        .first()
    )
    return assignment_for(member) if member else None


def open_members_on(node_name: str) -> dict[tuple[int, int], Assignment]:
    """Members placed on this node whose process has not been reported gone."""
    members = AttemptMember.objects.select_related("attempt__job__template", "attempt__job__tier", "node").filter(
        node__name=node_name, ended_at=None
    )
    return {(m.attempt_id, m.rank): assignment_for(m) for m in members}
