"""The plain start and the clean end (apps/jobs/services.py `starts_plainly`, `ends_plainly`): the
batch path (apps/jobs/batch_reports.py) applies only what they admit, so whatever they admit the
report services themselves must carry to the same outcome."""

from __future__ import annotations

import itertools

import pytest
from django.db import transaction

from apps.jobs import services
from apps.jobs.models import AttemptMember, Job, JobAttempt
from tests.unit.test_agent_batches import cast, placed  # noqa: F401 (a fixture)


class Undo(Exception):
    pass


def reported(attempt) -> services.ReportedMember:
    return services.lock_reported_members(attempt_ids=[attempt.pk])[(attempt.pk, 0)]


def set_states(attempt, *, member: str, attempt_state: str, job: str, stop: str = "") -> None:
    AttemptMember.objects.filter(attempt=attempt).update(state=member)
    JobAttempt.objects.filter(pk=attempt.pk).update(state=attempt_state, stop_requested=stop)
    Job.objects.filter(pk=attempt.job_id).update(state=job)


def states(attempt) -> tuple[str, str, str]:
    member = AttemptMember.objects.select_related("attempt__job").get(attempt=attempt)
    return member.state, member.attempt.state, member.attempt.job.state


STATES = ("starting", "running", "preempting", "succeeded")


@pytest.mark.django_db(transaction=False)
def test_every_start_the_rule_calls_plain_the_service_starts_all_the_way(cast):  # noqa: F811
    (attempt,) = placed(cast, 1, {"h1": 1})
    admitted = 0
    for member, attempt_state, job in itertools.product(STATES, repeat=3):
        try:
            with transaction.atomic():
                set_states(attempt, member=member, attempt_state=attempt_state, job=job)
                found = reported(attempt)
                if services.starts_plainly(found):
                    admitted += 1
                    assert services.member_started(found, pid=5)
                    assert states(attempt) == ("running",) * 3, (member, attempt_state, job)
                raise Undo
        except Undo:
            pass
    assert admitted >= 1


@pytest.mark.django_db(transaction=False)
def test_every_end_the_rule_calls_clean_the_service_ends_as_succeeded(cast):  # noqa: F811
    (attempt,) = placed(cast, 1, {"h1": 1})
    admitted = 0
    bodies = [(0, "", ""), (1, "", ""), (0, "timeout", ""), (0, "", "ck.pt")]
    for member, attempt_state, job, stop, body in itertools.product(
        ("starting", "running"), STATES, STATES, ("", "cancel", "preempt"), bodies
    ):
        exit_code, reason, checkpoint = body
        try:
            with transaction.atomic():
                set_states(attempt, member=member, attempt_state=attempt_state, job=job, stop=stop)
                found = reported(attempt)
                if services.ends_plainly(found, exit_code=exit_code, reason=reason,
                                         checkpoint=checkpoint):  # fmt: skip
                    admitted += 1
                    assert services.member_finished(
                        found, exit_code=exit_code, reason=reason, checkpoint=checkpoint
                    )
                    assert states(attempt) == ("succeeded",) * 3, (member, attempt_state, job)
                raise Undo
        except Undo:
            pass
    assert admitted >= 1


def test_a_clean_exit_is_exit_code_0_with_no_reason():
    assert services.clean_exit(0, "")
    assert not services.clean_exit(1, "") and not services.clean_exit(None, "")
    assert not services.clean_exit(0, "timeout")
