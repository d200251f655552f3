"""What a node's change means for the attempts on it: jobs' in-transaction handlers of the
events apps/nodes emits (apps/platform/events.py), subscribed in apps/jobs/apps.py. They run
in the node's transaction, so a node and its attempts change together."""

from django.utils import timezone

from apps.jobs.models import (
    ATTEMPT_ACTIVE,
    AttemptMember,
    AttemptState,
    GpuAllocation,
    Job,
    JobAttempt,
)
from apps.jobs.services import attempt_lost, job_preempt
from apps.platform import events
from apps.platform.errors import ServiceError


def renew_leases(event: events.NodeAlive) -> None:
    # Only attempts with a member still running here: one whose members all ended must not be
    # kept alive by the heartbeat (reconcile settles it).
    JobAttempt.objects.filter(
        state__in=[AttemptState.RUNNING, AttemptState.PREEMPTING],
        members__node_id=event.node_id,
        members__ended_at=None,
    ).update(lease_expires_at=event.lease_until)


def lose_attempts_on_node(event: events.NodeLost) -> None:
    now = timezone.now()
    node_id = event.node_id
    attempts = JobAttempt.objects.filter(
        members__node_id=node_id, members__ended_at=None
    ).distinct()
    for attempt in attempts:
        # This node's members are gone with their agent: end them and free their GPUs here.
        AttemptMember.objects.filter(attempt=attempt, node_id=node_id, ended_at=None).update(
            state=AttemptState.LOST, ended_at=now
        )
        GpuAllocation.objects.filter(
            attempt=attempt, gpu__node_id=node_id, released_at=None
        ).update(released_at=now)
        if attempt.state in ATTEMPT_ACTIVE:
            attempt_lost(attempt=attempt, reason=event.reason, actor="system:reconcile")


def preempt_on_drained_nodes(event: events.DrainOverdue) -> list[str]:
    """The ids of the jobs preempted."""
    preempted = []
    jobs = Job.objects.filter(
        attempts__state__in=[AttemptState.STARTING, AttemptState.RUNNING],
        attempts__members__node_id__in=event.node_ids,
        attempts__members__ended_at=None,
    ).distinct()
    for job in jobs:
        try:
            job_preempt(job=job, actor="system:reconcile", reason=event.reason)
            preempted.append(str(job.pk))
        except ServiceError:
            continue  # it ended or moved meanwhile
    return preempted
