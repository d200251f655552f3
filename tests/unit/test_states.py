"""A job's legal moves live in one table (apps/jobs/states.py); transition_job refuses a move
the table does not have, and without `expect=` takes every state the table allows."""

import pytest

from apps.jobs import services
from apps.jobs.models import (
    ATTEMPT_ACTIVE,
    ATTEMPT_TERMINAL,
    JOB_ACTIVE,
    AttemptState,
    Job,
    JobState,
)
from apps.jobs.states import (
    ATTEMPT_MOVES,
    JOB_MOVES,
    IllegalMove,
    attempt_sources,
    check_job_move,
    job_sources,
)
from tests.factories import make_cast
from tests.unit.test_dispatcher import submit


def test_every_state_has_its_row():
    assert set(JOB_MOVES) == set(JobState)
    assert set(ATTEMPT_MOVES) == set(AttemptState)
    assert all(to in JobState for targets in JOB_MOVES.values() for to in targets)


def test_a_queued_job_is_placed_ended_or_requeued_never_run_directly():
    assert JOB_MOVES[JobState.QUEUED] == {
        JobState.STARTING, JobState.QUEUED, JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED,
    }  # fmt: skip
    assert JobState.RUNNING not in JOB_MOVES[JobState.QUEUED]


def test_only_a_starting_job_starts_running_and_only_a_placed_one_is_preempted():
    assert job_sources(JobState.RUNNING) == (JobState.STARTING,)
    assert job_sources(JobState.PREEMPTING) == (JobState.STARTING, JobState.RUNNING)
    assert job_sources(JobState.STARTING) == (JobState.QUEUED,)


def test_what_the_call_sites_listed_by_hand_is_what_the_table_gives():
    assert job_sources(JobState.CANCELLED) == JOB_ACTIVE  # job_cancel's old expect=
    assert set(job_sources(JobState.QUEUED)) == set(
        JobState
    )  # job_requeue's old expect=list(JobState)
    for end in ATTEMPT_TERMINAL:  # end_attempt's old expect=ATTEMPT_ACTIVE
        assert attempt_sources(end) == ATTEMPT_ACTIVE


def test_a_terminal_job_only_comes_back_through_the_queue():
    for state in (JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED):
        assert JOB_MOVES[state] == {JobState.QUEUED}


def test_an_ended_attempt_never_moves_again():
    assert all(ATTEMPT_MOVES[state] == frozenset() for state in ATTEMPT_TERMINAL)


def test_an_illegal_move_is_refused_with_its_states_named():
    with pytest.raises(IllegalMove, match="may not move from succeeded to running"):
        check_job_move([JobState.SUCCEEDED], JobState.RUNNING)
    with pytest.raises(IllegalMove, match="not a job state"):
        check_job_move([JobState.QUEUED], "paused")


@pytest.fixture
def cast(db):
    return make_cast()


def test_transition_job_refuses_a_move_the_table_does_not_have(cast):
    job = submit(cast, gpus=1)
    with pytest.raises(IllegalMove):
        services.transition_job(job, to=JobState.RUNNING, expect=[JobState.QUEUED], actor="test")
    job.refresh_from_db()
    assert job.state == JobState.QUEUED and job.version == Job.objects.get(pk=job.pk).version


def test_transition_job_without_expect_takes_the_tables_sources(cast):
    job = submit(cast, gpus=1)
    assert services.transition_job(job, to=JobState.CANCELLED, actor="test")
    assert Job.objects.get(pk=job.pk).state == JobState.CANCELLED
    assert not services.transition_job(
        job, to=JobState.CANCELLED, actor="test"
    )  # cancelled -> cancelled: no row
