"""A report call's ends read no dependents for a job that no pending dependency waited on when
the call read it after its row lock (apps/jobs/services.py `ReportedMember.awaited`). That holds
because a submit locks a parent before it writes a dependency on it: made to happen on purpose
here, one transaction held open at the point that matters while the other runs into it."""

from django.db import transaction

from apps.jobs import batch_reports
from apps.jobs.models import JOB_PLACED, Job, JobAttempt, JobState
from apps.jobs.services import lock_reported_members
from apps.scheduling.dispatcher import dispatch_once
from tests.concurrency.test_races import (  # noqa: F401 (bob: a fixture)
    INFER,
    bob,
    held_open,
    in_thread,
    pytestmark,
    submit,
    wait_for_a_lock_wait,
)


def depends_on(client, parent: str) -> str:
    body = {**INFER, "depends_on": [{"job": parent, "condition": "afterok"}]}
    response = client.post("/api/v1/jobs/", body, format="json")
    assert response.status_code == 201, response.content
    return response.json()["id"]


def runs(attempt: JobAttempt):
    """The parent's start and clean end in one group, as a quick job's report call applies them."""

    def change():
        reported = lock_reported_members(attempt_ids=[attempt.pk])[(attempt.pk, 0)]
        assert reported.awaited is False  # none yet: its end reads no dependents
        batch_reports.members_ran_together([(reported, 7)])

    return change


def test_a_dependent_submitted_while_its_parents_end_is_open_waits_and_reads_the_end(bob):  # noqa: F811
    parent = submit(bob)
    dispatch_once()
    ender, release = held_open(runs(JobAttempt.objects.get(job_id=parent)))
    made = []
    submitter = in_thread(lambda: made.append(depends_on(bob, parent)))
    wait_for_a_lock_wait()  # the submit waits for the parent's row
    release.set()
    ender.join()
    submitter.join()

    assert Job.objects.get(pk=parent).state == JobState.SUCCEEDED
    dependent = Job.objects.get(pk=made[0])  # released (a dispatch pass may have placed it)
    assert dependent.held_by_dependencies is False and dependent.state in (
        JobState.QUEUED,
        *JOB_PLACED,
    )


def test_a_parents_end_waiting_for_a_dependents_submit_reads_it_and_releases_it(bob):  # noqa: F811
    parent = submit(bob)
    dispatch_once()
    attempt = JobAttempt.objects.get(job_id=parent)
    made: list[str] = []
    submitter, release = held_open(lambda: made.append(depends_on(bob, parent)))
    seen = []

    def ends():
        with transaction.atomic():
            reported = lock_reported_members(attempt_ids=[attempt.pk])[(attempt.pk, 0)]
            seen.append(reported.awaited)
            batch_reports.members_ran_together([(reported, 7)])

    ender = in_thread(ends)
    wait_for_a_lock_wait()  # the parent's lock waits for the submit's transaction
    release.set()
    submitter.join()
    ender.join()

    assert seen == [True]  # read after the lock: the committed dependency is seen
    dependent = Job.objects.get(pk=made[0])  # released (a dispatch pass may have placed it)
    assert dependent.held_by_dependencies is False and dependent.state in (
        JobState.QUEUED,
        *JOB_PLACED,
    )
