"""The reconcile tick: repair what a lost message, a dead agent or a restarted Redis left."""

import logging

from django.utils import timezone

from apps.jobs.arrays import end_settled_arrays
from apps.jobs.models import ATTEMPT_ACTIVE, AttemptMember, AttemptState, JobAttempt
from apps.jobs.services import attempt_lost, attempt_orphaned
from apps.nodes.services import mark_silent_nodes_lost, preempt_past_drain_deadline
from apps.platform.retry import retried

log = logging.getLogger(__name__)


@retried  # a deadlock PostgreSQL broke: the tick again (each of its repairs is guarded)
def reconcile_once() -> dict:
    lost_nodes = mark_silent_nodes_lost()
    expired = expire_leases()
    orphans = settle_orphans()
    drained = preempt_past_drain_deadline()
    arrays = end_settled_arrays()
    return {"lost_nodes": lost_nodes, "expired_attempts": expired, "orphaned_attempts": orphans,
            "preempted_for_drain": drained, "arrays_ended": arrays}  # fmt: skip


def expire_leases() -> int:
    """An attempt whose lease ran out (never started, or its agent stopped renewing) is lost."""
    stale = JobAttempt.objects.filter(
        state__in=[AttemptState.STARTING, AttemptState.RUNNING, AttemptState.PREEMPTING],
        lease_expires_at__lt=timezone.now(),
    )
    count = 0
    for attempt in stale:
        log.warning("attempt %s lease expired in state %s", attempt, attempt.state)
        attempt_lost(
            attempt=attempt, reason=f"lease expired while {attempt.state}", actor="system:reconcile"
        )
        count += 1
    return count


def settle_orphans() -> int:
    """An attempt still active whose members have all ended was never settled (a report's write
    lost to a race): its agent may keep renewing the lease, so settle it now."""
    running = AttemptMember.objects.filter(ended_at=None).values("attempt_id")
    orphans = JobAttempt.objects.filter(state__in=ATTEMPT_ACTIVE, members__isnull=False).exclude(
        pk__in=running
    )
    count = 0
    for attempt_id in orphans.values_list("pk", flat=True).distinct():
        log.warning("attempt %s is active but all its members ended; settling it", attempt_id)
        count += attempt_orphaned(attempt_id=attempt_id, actor="system:reconcile")
    return count
