"""Retries: infrastructure failures come back after an exponential backoff the dispatcher
respects, up to MAX_ATTEMPTS; a user error fails the job unless the job asked to be retried."""

from datetime import timedelta

import pytest
from django.utils import timezone

from apps.jobs import services
from apps.jobs.models import Job
from apps.nodes.models import Node
from apps.nodes.services import mark_silent_nodes_lost
from apps.scheduling.dispatcher import dispatch_once
from tests.factories import make_cast, make_node
from tests.unit.test_dispatcher import submit


@pytest.fixture
def cast(db):
    return make_cast()


@pytest.fixture(autouse=True)
def backoff(settings):
    settings.RETRY_BACKOFF_SECONDS = 10
    settings.RETRY_BACKOFF_MAX_SECONDS = 25
    settings.MAX_ATTEMPTS = 3


def lose_node(name: str) -> None:
    Node.objects.filter(name=name).update(last_heartbeat_at=timezone.now() - timedelta(minutes=5))
    assert mark_silent_nodes_lost() == [name]
    Node.objects.filter(name=name).update(state="ready", last_heartbeat_at=timezone.now())


def run_and_exit(job: Job, exit_code: int, reason: str = "") -> None:
    attempt = job.attempts.order_by("-number").first()
    token = str(attempt.token)
    services.attempt_member_started(attempt_id=attempt.pk, rank=0, token=token, pid=1)
    services.attempt_member_finished(
        attempt_id=attempt.pk, rank=0, token=token, exit_code=exit_code, reason=reason
    )


def end_backoff(job: Job) -> None:
    Job.objects.filter(pk=job.pk).update(not_before=timezone.now() - timedelta(seconds=1))


def test_the_backoff_doubles_up_to_its_max():
    assert [services.retry_backoff(n) for n in (1, 2, 3, 4)] == [10, 20, 25, 25]


def test_a_job_lost_with_its_node_waits_out_its_backoff_before_it_is_placed_again(cast):
    make_node("h1", gpus=2)
    job = submit(cast, gpus=2)
    dispatch_once()
    lose_node("h1")
    job.refresh_from_db()
    assert job.state == "queued"
    assert job.not_before > timezone.now() + timedelta(seconds=8)
    assert "node h1 lost (no heartbeat); retry 1 of 2 after 10s backoff (not before" in job.reason
    assert dispatch_once().placed == []  # the GPUs are free, but the backoff is not over
    job.refresh_from_db()
    assert "retry 1 of 2" in job.reason  # the user still sees why it waits
    end_backoff(job)
    assert dispatch_once().placed == [str(job.id)]


def test_a_job_lost_max_attempts_times_fails(cast):
    make_node("h1", gpus=2)
    job = submit(cast, gpus=2)
    for _ in range(3):
        end_backoff(job)
        assert dispatch_once().placed == [str(job.id)]
        lose_node("h1")
    job.refresh_from_db()
    assert job.state == "failed"
    assert job.reason.endswith("gave up after 3 failed attempts")
    assert list(job.attempts.values_list("state", flat=True)) == ["lost", "lost", "lost"]


def test_preemptions_do_not_use_up_the_retries(cast):
    make_node("h1", gpus=2)
    job = submit(cast, gpus=2)
    for _ in range(3):
        dispatch_once()
        attempt = job.attempts.order_by("-number").first()
        services.attempt_member_started(
            attempt_id=attempt.pk, rank=0, token=str(attempt.token), pid=1
        )
        services.job_preempt(job=job, actor="test", reason="room for another job")
        services.attempt_member_finished(attempt_id=attempt.pk, rank=0, token=str(attempt.token), exit_code=0,
                                         reason="preempt")  # fmt: skip
    job.refresh_from_db()
    assert (job.state, job.not_before) == ("queued", None)  # a preempted job is not held back
    dispatch_once()
    lose_node("h1")
    job.refresh_from_db()
    assert job.state == "queued" and "retry 1 of 2" in job.reason


def test_a_user_error_is_not_retried(cast):
    make_node("h1", gpus=1)
    job = submit(cast)
    dispatch_once()
    run_and_exit(job, 3)
    job.refresh_from_db()
    assert (job.state, job.exit_code, job.reason) == ("failed", 3, "exit code 3")


def test_a_job_that_asks_is_retried_after_a_user_error_then_fails_at_the_limit(cast):
    make_node("h1", gpus=1)
    job = submit(cast)
    Job.objects.filter(pk=job.pk).update(retry_on_failure=True)
    dispatch_once()
    run_and_exit(job, 3)
    job.refresh_from_db()
    assert job.state == "queued" and job.reason.startswith(
        "exit code 3; retry 1 of 2 after 10s backoff"
    )
    for _ in range(2):
        end_backoff(job)
        dispatch_once()
        run_and_exit(job, 3)
    job.refresh_from_db()
    assert (job.state, job.exit_code) == ("failed", 3)
    assert job.reason == "exit code 3; gave up after 3 failed attempts"


def test_a_job_that_asks_is_not_retried_past_its_max_runtime(cast):
    make_node("h1", gpus=1)
    job = submit(cast)
    Job.objects.filter(pk=job.pk).update(retry_on_failure=True)
    dispatch_once()
    run_and_exit(job, -15, reason="timeout")
    job.refresh_from_db()
    assert (job.state, job.reason) == ("failed", "timeout")


def test_a_job_that_asks_is_not_retried_when_its_own_code_cannot_run(cast):
    """A refused bundle, a failed environment build, a deleted secret (workers/prepare.py): the
    agent reports them retryable: false, and no retry could change them."""
    make_node("h1", gpus=1)
    job = submit(cast)
    Job.objects.filter(pk=job.pk).update(retry_on_failure=True)
    dispatch_once()
    attempt = job.attempts.get()
    token = str(attempt.token)
    services.attempt_member_started(attempt_id=attempt.pk, rank=0, token=token, pid=0)
    reason = "environment: No solution found when resolving dependencies"
    services.attempt_member_finished(attempt_id=attempt.pk, rank=0, token=token, exit_code=127,
                                     reason=reason, retryable=False)  # fmt: skip
    job.refresh_from_db()
    assert (job.state, job.reason, job.attempts.count()) == ("failed", reason, 1)


def test_a_lost_gang_is_not_placed_again_while_a_member_of_its_last_attempt_still_runs(cast):
    for name in ("h1", "h2", "h3"):
        make_node(name, gpus=1)
    job = submit(cast, gpus=1, nodes=2)
    dispatch_once()
    attempt = job.attempts.get()
    token = str(attempt.token)
    for rank in (0, 1):
        services.attempt_member_started(attempt_id=attempt.pk, rank=rank, token=token, pid=1)
    survivor, lost = attempt.members.order_by("rank")
    lose_node(lost.node.name)  # rank 1's node is lost; rank 0 is told to stop but still runs
    end_backoff(job)
    assert dispatch_once().placed == []  # two nodes are free, but rank 0's process is not gone yet
    services.attempt_member_finished(
        attempt_id=attempt.pk, rank=0, token=token, exit_code=-15, reason="lost"
    )
    assert dispatch_once().placed == [str(job.id)]


def test_an_attempt_whose_lease_expires_is_lost_and_retried_behind_its_backoff(cast):
    from apps.jobs.models import JobAttempt
    from apps.scheduling.reconcile import expire_leases

    make_node("h1", gpus=1)
    job = submit(cast)
    dispatch_once()
    JobAttempt.objects.filter(job=job).update(
        lease_expires_at=timezone.now() - timedelta(seconds=1)
    )
    assert expire_leases() == 1
    job.refresh_from_db()
    assert job.attempts.get().state == "lost"
    assert job.state == "queued" and job.reason.startswith(
        "lease expired while starting; retry 1 of 2 after 10s"
    )


def test_staff_requeue_skips_the_backoff(cast):
    make_node("h1", gpus=1)
    job = submit(cast)
    dispatch_once()
    lose_node("h1")
    services.job_requeue(
        job=Job.objects.get(pk=job.pk), actor="staff:support", reason="requeued by support"
    )
    assert dispatch_once().placed == [str(job.id)]
