"""A member's exit report racing a preemption of its job (found by the HA chaos test in CI).

The report read the job, a preemption committed, then the report's guarded transition used the
stale version: nothing changed and the job sat in `preempting` until its lease ran out. The
report now locks the job first, like job_preempt, so one of the two goes after the other."""

import threading
import time

import pytest
from django.db import connection, connections

from apps.jobs import services
from apps.jobs.models import Job
from apps.scheduling.dispatcher import dispatch_once
from tests.factories import make_cast, make_node
from tests.unit.test_dispatcher import placed_and_started, submit


@pytest.mark.django_db(transaction=True)
def test_an_exit_report_and_a_preemption_never_leave_the_job_stuck(monkeypatch):
    if connection.vendor != "postgresql":
        pytest.skip("SQLite runs one write transaction at a time: no interleaving to test")
    make_node("h1", gpus=1)
    job, attempt = placed_and_started(make_cast())

    settle = services._settle_attempt
    reading = threading.Event()

    def slow_settle(*args, **kwargs):  # widen the window between the report's reads and its write
        reading.set()
        time.sleep(0.5)
        return settle(*args, **kwargs)

    monkeypatch.setattr(services, "_settle_attempt", slow_settle)
    errors = []

    def preempt():
        reading.wait(5)
        try:
            services.job_preempt(job=Job.objects.get(pk=job.pk), actor="test", reason="race")
        except services.ServiceError as exc:  # the job ended first: nothing to preempt
            errors.append(exc)
        finally:
            connections.close_all()  # this thread's connection, so the test database can go

    other = threading.Thread(target=preempt)
    other.start()
    services.attempt_member_finished(
        attempt_id=attempt.pk, rank=0, token=str(attempt.token), exit_code=0
    )
    other.join(10)
    job.refresh_from_db()
    assert job.state == "succeeded"  # the exit won; the preemption found it ended
    assert len(errors) == 1


@pytest.mark.django_db
def test_reconcile_settles_an_attempt_whose_members_all_ended():
    """The repair for any report that loses its write: the attempt is settled by the next
    reconcile tick instead of waiting for a lease its agent may keep renewing."""
    from apps.jobs.models import AttemptMember
    from apps.scheduling.reconcile import reconcile_once

    make_node("h1", gpus=1)
    job, attempt = placed_and_started(make_cast())
    services.job_preempt(job=Job.objects.get(pk=job.pk), actor="test", reason="make room")
    # The member's end was written but the settling was lost.
    AttemptMember.objects.filter(attempt=attempt).update(
        state="succeeded", exit_code=0, ended_at=attempt.created_at
    )
    assert reconcile_once()["orphaned_attempts"] == 1
    job.refresh_from_db()
    attempt.refresh_from_db()
    assert (job.state, attempt.state) == ("queued", "preempted")
    assert reconcile_once()["orphaned_attempts"] == 0


@pytest.mark.django_db
def test_a_heartbeat_renews_only_attempts_with_a_member_still_running():
    from datetime import timedelta

    from django.utils import timezone

    from apps.jobs.models import AttemptMember, JobAttempt
    from apps.nodes.models import Node
    from apps.nodes.services import _renew_leases

    cast = make_cast()
    make_node("h1", gpus=2)
    jobs = [submit(cast), submit(cast)]
    dispatch_once()
    attempts = [job.attempts.get() for job in jobs]
    for attempt in attempts:
        services.attempt_member_started(
            attempt_id=attempt.pk, rank=0, token=str(attempt.token), pid=1
        )
    AttemptMember.objects.filter(attempt=attempts[0]).update(
        ended_at=timezone.now()
    )  # a lost settle
    past = timezone.now() - timedelta(seconds=60)
    JobAttempt.objects.filter(pk__in=[a.pk for a in attempts]).update(lease_expires_at=past)
    _renew_leases(Node.objects.get(name="h1"), timezone.now())
    ended, live = (JobAttempt.objects.get(pk=a.pk).lease_expires_at for a in attempts)
    assert ended == past and live > timezone.now()
