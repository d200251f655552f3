"""The reconcile tick: repair what a lost message, a dead agent or a restarted Redis left."""

import logging

from django.utils import timezone

from apps.jobs.models import AttemptState, JobAttempt
from apps.jobs.services import attempt_lost
from apps.nodes.services import mark_silent_nodes_lost, preempt_past_drain_deadline

log = logging.getLogger(__name__)


def reconcile_once() -> dict:
    lost_nodes = mark_silent_nodes_lost()
    expired = expire_leases()
    drained = preempt_past_drain_deadline()
    return {"lost_nodes": lost_nodes, "expired_attempts": expired, "preempted_for_drain": drained}


def expire_leases() -> int:
    """An attempt whose lease ran out (never started, or its agent stopped renewing) is lost."""
    stale = JobAttempt.objects.filter(
        state__in=[AttemptState.STARTING, AttemptState.RUNNING, AttemptState.PREEMPTING],
        lease_expires_at__lt=timezone.now(),
    )
    count = 0
    for attempt in stale:
        log.warning("attempt %s lease expired in state %s", attempt, attempt.state)
        attempt_lost(attempt=attempt, reason=f"lease expired while {attempt.state}", actor="system:reconcile")
        count += 1
    return count
