"""Read-only queries used by node agents: what they should be running."""

from django.db.models import Prefetch

from apps.jobs.models import ATTEMPT_ACTIVE, AttemptMember
from apps.platform.agent_protocol import (  # the wire types, defined without Django
    INTERACTIVE_HOLD,
    Assignment,
)


def assignment_for(member: AttemptMember) -> Assignment:
    attempt = member.attempt
    if "members" in getattr(attempt, "_prefetched_objects_cache", {}):
        members = list(attempt.members.all())  # _with_gang: ordered by rank, nodes joined
    else:
        members = list(attempt.members.select_related("node").order_by("rank"))
    # This member is to run: a gang's attempt stays active after one member's end.
    return assignment_of(attempt.job, attempt, rank=member.rank, gpu_indices=member.gpu_indices,
                         world_size=len(members), leader=members[0].node,
                         active=attempt.state in ATTEMPT_ACTIVE and member.ended_at is None)  # fmt: skip


def assignment_of(job, attempt, *, rank: int, gpu_indices, world_size: int, leader, active: bool,
                  resume_from: str | None = None) -> Assignment:  # fmt: skip
    """A member's assignment from its job, its attempt and the node of rank 0 (`labels`,
    `hostname`): rows already in memory (the dispatcher builds its start messages' from the
    rows it has just written), no query but the job's template where it is not loaded."""
    template = job.template  # None without a query when the job has none
    argv = list(template.argv) if template is not None else list(job.command or [])
    if job.interactive:
        argv = list(INTERACTIVE_HOLD)  # its `command` is what its shells run (workers/sessions.py)
    return Assignment(
        job_id=str(job.pk),
        attempt_id=attempt.pk,
        attempt_number=attempt.number,
        rank=rank,
        token=str(attempt.token),
        argv=argv,
        params=job.params,
        gpu_indices=list(gpu_indices),
        world_size=world_size,
        master_addr=leader.labels.get("address") or leader.hostname or "127.0.0.1",
        master_port=attempt.master_port or 0,  # 0: rank 0's agent has not leased it yet
        max_runtime_seconds=job.max_runtime_seconds,
        checkpoint=attempt.checkpoint,
        stop_requested=attempt.stop_requested,
        active=active,
        grace_seconds=job.tier.preemption_grace_seconds,
        memory_mib=job.memory_mib,
        pids_max=job.pids_max,
        cpu_weight=job.cpu_weight,
        bundle=job.bundle,
        env=dict(job.env or {}),
        secrets=list(job.secrets or []),  # names only: the values come from the secrets endpoint
        python_requirements=list((job.python or {}).get("requirements") or []),
        array_index=job.array_index,
        inputs=job.has_dependencies,
        resume_from=resume_from,
        image=job.image,
        image_digest=job.image_digest,
        image_auth=bool(job.image_pull_secret),
        interactive=job.interactive,
        idle_timeout_seconds=60 * (job.idle_timeout_minutes or job.tier.interactive_idle_minutes)
        if job.interactive
        else 0,
    )


def assignment(attempt_id: int, rank: int, token: str) -> Assignment | None:
    member = (
        AttemptMember.objects.select_related("attempt__job__template", "attempt__job__tier", "node")
        .filter(attempt_id=attempt_id, rank=rank, attempt__token=token)
        .first()
    )
    return assignment_for(member) if member else None


def _with_gang(members):
    """Members with what assignment_for reads, in a fixed number of queries however many."""
    gang = AttemptMember.objects.select_related("node").order_by("rank")
    return members.select_related(
        "attempt__job__template", "attempt__job__tier", "node"
    ).prefetch_related(Prefetch("attempt__members", queryset=gang))


def open_members_on(node_name: str) -> dict[tuple[int, int], Assignment]:
    """Members placed on this node whose process has not been reported gone."""
    members = _with_gang(
        AttemptMember.objects.filter(node__name=node_name, ended_at=None).order_by(
            "attempt_id", "rank"
        )
    )  # by key, not Meta's ordering through attempt and job (joins on every heartbeat)
    return {(m.attempt_id, m.rank): assignment_for(m) for m in members}


def members_on(node_name: str, attempt_ids: list[int]) -> list[AttemptMember]:
    """These attempts' members placed on this node, ended or not (assignment_for says which)."""
    members = AttemptMember.objects.filter(node__name=node_name, attempt_id__in=attempt_ids)
    return list(_with_gang(members.order_by("attempt_id", "rank")))
