"""Helpers for page tests: take a submitted job through the services the agents call."""

from datetime import timedelta

from django.utils import timezone

from apps.jobs import services
from apps.jobs.models import GpuAllocation, Job, JobAttempt
from apps.scheduling.dispatcher import dispatch_once


def start(job: Job, *, dispatch: bool = True) -> JobAttempt:
    """Place the job (a dispatch pass, unless it was placed already) and report its one member
    started."""
    if dispatch:
        dispatch_once()
    attempt = job.attempts.order_by("-number").first()
    assert attempt is not None, "the dispatcher placed nothing"
    services.attempt_member_started(attempt_id=attempt.pk, rank=0, token=str(attempt.token), pid=1)
    return attempt


def finish(attempt: JobAttempt, exit_code: int = 0) -> None:
    services.attempt_member_finished(
        attempt_id=attempt.pk, rank=0, token=str(attempt.token), exit_code=exit_code
    )


def backdate(job: Job, *, started_ago: float, ran: float | None = None) -> None:
    """Move a job's start (and its GPUs' allocation) `started_ago` seconds into the past and, for
    an ended one, its end to `ran` seconds after the start."""
    now = timezone.now()
    started = now - timedelta(seconds=started_ago)
    fields = {"started_at": started}
    if ran is not None:
        fields["finished_at"] = started + timedelta(seconds=ran)
    Job.objects.filter(pk=job.pk).update(**fields)
    held = GpuAllocation.objects.filter(attempt__job=job)
    held.update(allocated_at=started)
    if ran is not None:
        held.update(released_at=started + timedelta(seconds=ran))
