"""A job's and an attempt's guarded moves and their audit events: the primitives every service
of apps.jobs (apps/jobs/services.py, apps/jobs/placement.py) and its neighbours build on.

A move is `filter(pk, state in expected, version).update(...)` that checks exactly one row
changed; the table in apps/jobs/states.py says which moves exist.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable

from django.db.models import F

from apps.jobs.models import JOB_TERMINAL, Job, JobAttempt, JobEvent
from apps.jobs.states import attempt_sources, check_attempt_move, check_job_move, job_sources
from apps.platform import events

# The moves' log lines keep the logger name they had before this module was split out of
# apps/jobs/services.py (a log filter on it keeps working).
log = logging.getLogger("apps.jobs.services")


def new_event(job: Job, *, actor: str, reason: str = "", from_state: str = "", to_state: str = "",
              attempt: JobAttempt | None = None, kind: str = "state", data: dict | None = None) -> JobEvent:  # fmt: skip
    """An audit event, not yet saved (`record_event` saves one; a batch is bulk-created)."""
    return JobEvent(
        job=job, attempt=attempt, kind=kind, from_state=from_state, to_state=to_state,
        actor=actor, reason=reason[:300], data=data or {},
    )  # fmt: skip


def record_event(job: Job, **fields) -> JobEvent:
    event = new_event(job, **fields)
    event.save()
    return event


def log_move(
    job: Job, *, from_state: str, actor: str, reason: str, attempt: JobAttempt | None
) -> None:
    log.info("job %s %s -> %s by %s: %s", job.pk, from_state, job.state, actor, reason,
             extra={"job_id": job.pk, "attempt_id": attempt.pk if attempt else None})  # fmt: skip


def transition_job(job: Job, *, to: str, expect: Iterable[str] | None = None, actor: str, reason: str = "",
                   attempt: JobAttempt | None = None, **fields) -> bool:  # fmt: skip
    """Move `job` to state `to` if it is still in one of `expect` at the version we read.

    `expect` defaults to every state the table in apps/jobs/states.py allows to reach `to`; a
    move the table does not have raises IllegalMove. A terminal state emits JobEnded (the
    result cache settles the job's followers in this transaction)."""
    expect = job_sources(to) if expect is None else tuple(expect)
    check_job_move(expect, to)
    if reason:
        fields.setdefault("reason", reason[:300])
    updated = Job.objects.filter(pk=job.pk, state__in=expect, version=job.version).update(
        state=to, version=F("version") + 1, **fields
    )
    if not updated:
        return False
    from_state = job.state
    job.state, job.version = to, job.version + 1
    for name, value in fields.items():
        setattr(job, name, value)
    record_event(
        job, actor=actor, reason=reason, from_state=from_state, to_state=to, attempt=attempt
    )
    log_move(job, from_state=from_state, actor=actor, reason=reason, attempt=attempt)
    if to in JOB_TERMINAL:
        events.emit(events.JobEnded(job=job))
    return True


def transition_attempt(
    attempt: JobAttempt, *, to: str, expect: Iterable[str] | None = None, **fields
) -> bool:
    """The attempt's guarded update; `expect` as for transition_job, from the attempt table."""
    expect = attempt_sources(to) if expect is None else tuple(expect)
    check_attempt_move(expect, to)
    updated = JobAttempt.objects.filter(
        pk=attempt.pk, state__in=expect, version=attempt.version
    ).update(state=to, version=F("version") + 1, **fields)
    if updated:
        attempt.state, attempt.version = to, attempt.version + 1
        for name, value in fields.items():
            setattr(attempt, name, value)
    return bool(updated)


# --- the same move for several rows at once (a batch of agent reports) ---------------------------
# The updates themselves are apps/jobs/batch_reports.py's (one statement for a group on PostgreSQL);
# these are the objects', the events' and the ends' side of them.


class BatchRefused(Exception):
    """A guarded update of several rows changed fewer than it named: one of them moved since it
    was read (apps/jobs/batch_reports.py). The caller rolls its transaction back and applies the
    batch's items one by one."""


def moved(row, *, to: str, steps: int = 1, **fields) -> None:
    """The object of a row that a batch's guarded update moved (apps/jobs/batch_reports.py), as
    the row is now: `steps` moves, each a version."""
    row.state, row.version = to, row.version + steps
    for name, value in fields.items():
        setattr(row, name, value)


def _hops(from_state: str, to: str, reason: str,
          through: tuple[str, str] | None) -> list[tuple[str, str, str]]:  # fmt: skip
    """A move's (from, to, reason) steps: one, or two where it passed `through` a state."""
    if through:
        return [(from_state, through[0], through[1]), (through[0], to, reason)]
    return [(from_state, to, reason)]


def move_events(moves: list[tuple[Job, JobAttempt]], *, to: str, actor: str, reason: str = "",
                through: tuple[str, str] | None = None) -> list[JobEvent]:  # fmt: skip
    """The audit events (not yet saved) of moving each job of `moves` (as read, not yet moved)
    to `to`, as transition_job records them. `through`: (a state, its move's reason) the jobs
    pass on the way (a start and an end written at once): that move's event comes first, as if
    written on its own."""
    return [
        new_event(
            job, actor=actor, reason=why, from_state=from_state, to_state=to_state, attempt=attempt
        )  # fmt: skip
        for job, attempt in moves
        for from_state, to_state, why in _hops(job.state, to, reason, through)
    ]


def moved_jobs(moves: list[tuple[Job, JobAttempt]], *, to: str, actor: str, reason: str = "",
               through: tuple[str, str] | None = None, **fields) -> None:  # fmt: skip
    """After a batch's guarded update of the jobs and the moves' events (`move_events`) were
    written: the objects as the rows are, the log lines, and JobEnded for each
    job that ended. `through`: as for move_events, the log line of that move first."""
    if reason:
        fields.setdefault("reason", reason[:300])
    for job, attempt in moves:
        hops = _hops(job.state, to, reason, through)
        moved(job, to=to, steps=len(hops), **fields)
        for from_state, to_state, why in hops:
            job.state = to_state  # the log line's "->" names each hop's end
            log_move(job, from_state=from_state, actor=actor, reason=why, attempt=attempt)
    if to in JOB_TERMINAL:
        for job, _ in moves:
            events.emit(events.JobEnded(job=job))


def trigger_dispatch() -> None:
    """Ask the dispatcher for a pass once the current transaction commits (DispatchWanted:
    apps/scheduling/apps.py requests the pass)."""
    events.emit(events.DispatchWanted())
