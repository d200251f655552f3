"""A job's and an attempt's legal moves, in one table each: from-state -> allowed to-states.

`transition_job` and `transition_attempt` (apps/jobs/services.py) refuse a move the table does
not have (IllegalMove: a bug in the caller, never a race), and without an `expect=` they take
every state the table allows to reach the target. A caller that means fewer (the settling of
an attempt only moves a *placed* job) names one of the groups below.
"""

from __future__ import annotations

from collections.abc import Iterable

from apps.jobs.models import (
    ATTEMPT_ACTIVE,
    ATTEMPT_TERMINAL,
    JOB_ACTIVE,
    JOB_PLACED,
    JOB_TERMINAL,
    AttemptState,
    JobState,
)

__all__ = [
    "ATTEMPT_ACTIVE", "ATTEMPT_MOVES", "ATTEMPT_TERMINAL", "IllegalMove", "JOB_ACTIVE", "JOB_MOVES",
    "JOB_PLACED", "JOB_TERMINAL", "attempt_sources", "check_attempt_move", "check_job_move", "job_sources",
]  # fmt: skip

_ENDS = frozenset({JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED})

JOB_MOVES: dict[str, frozenset[str]] = {
    # Queued: placed; ended with its cache origin (a follower) or cancelled; requeued by staff.
    JobState.QUEUED: frozenset({JobState.STARTING, JobState.QUEUED}) | _ENDS,
    # Placed: runs, is preempted, ends, or goes back to the queue (a retry, a requeue).
    JobState.STARTING: frozenset({JobState.RUNNING, JobState.PREEMPTING, JobState.QUEUED}) | _ENDS,
    JobState.RUNNING: frozenset({JobState.PREEMPTING, JobState.QUEUED}) | _ENDS,
    # Preempting: requeued once its processes stopped, or ended meanwhile.
    JobState.PREEMPTING: frozenset({JobState.QUEUED}) | _ENDS,
    # Terminal: only support staff's requeue brings a job back.
    JobState.SUCCEEDED: frozenset({JobState.QUEUED}),
    JobState.FAILED: frozenset({JobState.QUEUED}),
    JobState.CANCELLED: frozenset({JobState.QUEUED}),
}

_OVER = frozenset(ATTEMPT_TERMINAL)

ATTEMPT_MOVES: dict[str, frozenset[str]] = {
    AttemptState.STARTING: frozenset({AttemptState.RUNNING, AttemptState.PREEMPTING}) | _OVER,
    AttemptState.RUNNING: frozenset({AttemptState.PREEMPTING}) | _OVER,
    AttemptState.PREEMPTING: _OVER,
    **{state: frozenset() for state in ATTEMPT_TERMINAL},  # an attempt never comes back
}


class IllegalMove(ValueError):
    """A transition the table does not allow: the calling code is wrong."""


def job_sources(to: str) -> tuple[str, ...]:
    """Every state from which a job may move to `to`, in the order JobState lists them."""
    return tuple(state for state in JobState if to in JOB_MOVES[state])


def attempt_sources(to: str) -> tuple[str, ...]:
    return tuple(state for state in AttemptState if to in ATTEMPT_MOVES[state])


def check_job_move(expect: Iterable[str], to: str) -> None:
    """Raise IllegalMove unless the table allows `to` from each state in `expect`."""
    _check(JOB_MOVES, "job", expect, to)


def check_attempt_move(expect: Iterable[str], to: str) -> None:
    _check(ATTEMPT_MOVES, "attempt", expect, to)


def _check(moves: dict[str, frozenset[str]], what: str, expect: Iterable[str], to: str) -> None:
    if to not in moves:
        raise IllegalMove(f"{to!r} is not a {what} state")
    illegal = [state for state in expect if to not in moves.get(state, ())]
    if illegal:
        raise IllegalMove(f"a {what} may not move from {', '.join(map(str, illegal))} to {to}")
