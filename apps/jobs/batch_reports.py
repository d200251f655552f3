"""Several members' plain starts and clean ends applied together: what a drain's batches of agent
reports are almost entirely made of, in a few statements for the whole batch instead of a few for
every report (apps/nodes/agent_api.py, ReportsView).

The moves are the report services' own (apps/jobs/services.py member_started, member_finished),
for the reports those services' own rules (`starts_plainly`, `ends_plainly`) call plain:
one guarded update of the members, of the attempts and of the jobs (each row at the version it
was read at), one insert of the jobs' audit events. Every row moves or none does: an update that
changes fewer rows than it names raises BatchRefused, the caller's whole transaction (the agent's
call) is rolled back and run again with each report applied alone, through the services. No
savepoint of its own: refusals are rare (none in a drain), a savepoint is two round trips each
group on PostgreSQL. On PostgreSQL a group's updates are one statement (`_AtOnce`): a quick
job's start and end take the call's lock, its read, that statement, the events' insert and the
dependents' read (7 statements with BEGIN and COMMIT, 12 before). The objects change only once
all was written.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence
from datetime import timedelta
from enum import Enum
from functools import cache
from typing import Any, cast

from django.conf import settings
from django.db import DatabaseError, connection, transaction
from django.db.models import Case, Field, IntegerField, Value, When
from django.utils import timezone

from apps.jobs import dependencies
from apps.jobs.models import (
    JOB_PLACED,
    AttemptMember,
    AttemptState,
    GpuAllocation,
    Job,
    JobAttempt,
    JobEvent,
    JobState,
)
from apps.jobs.services import ReportedMember
from apps.jobs.states import attempt_sources, check_attempt_move, check_job_move, job_sources
from apps.jobs.transitions import (
    BatchRefused,
    move_attempts,
    move_events,
    move_jobs,
    moved,
    moved_jobs,
    trigger_dispatch,
    update_all,
)
from apps.platform.db import prepared_cursor
from apps.platform.retry import retryable

log = logging.getLogger(__name__)


def _starting(pairs: list[tuple[ReportedMember, int]]) -> tuple:
    """What a group of starts writes with: now, the attempts' first lease, the members, their
    attempts, and their jobs split into those starting for the first time and those started
    before (requeued: a job keeps its first start time, as member_started keeps it)."""
    now = timezone.now()
    lease = now + timedelta(
        seconds=settings.HEARTBEAT_SECONDS * settings.NODE_LOST_AFTER_HEARTBEATS
    )
    members = [reported.member for reported, _ in pairs]
    attempts = [member.attempt for member in members]
    first = [attempt.job for attempt in attempts if attempt.job.started_at is None]
    again = [attempt.job for attempt in attempts if attempt.job.started_at is not None]
    return now, lease, members, attempts, first, again


def members_started_together(started: list[tuple[ReportedMember, int]]) -> None:
    """member_started(reported, pid=pid) for each pair (each passed services.starts_plainly), all
    or none (BatchRefused: a row had moved, `_together`)."""
    now, lease, members, attempts, first, again = _starting(started)
    reason = "all members started"
    moves = _by_actor(members, lambda job: job.started_at is None)

    def job_events() -> list[JobEvent]:
        return _events(moves, to=JobState.RUNNING, reason=reason)

    def write() -> None:
        if connection.vendor == "postgresql":
            return write_at_once()
        rows = AttemptMember.objects.filter(
            pk__in=[m.pk for m in members], state=AttemptState.STARTING
        )
        update_all(rows, len(members), state=AttemptState.RUNNING, pid=_per_member(started),
                   started_at=now)  # fmt: skip
        move_attempts(attempts, to=AttemptState.RUNNING, started_at=now, lease_expires_at=lease)
        if first:
            move_jobs(first, to=JobState.RUNNING, reason=reason, started_at=now)
        if again:
            move_jobs(again, to=JobState.RUNNING, reason=reason)
        JobEvent.objects.bulk_create(job_events())

    def write_at_once() -> None:  # the same updates, one statement (_AtOnce)
        check_attempt_move(attempt_sources(AttemptState.RUNNING), AttemptState.RUNNING)
        check_job_move(job_sources(JobState.RUNNING), JobState.RUNNING)
        at_once = _AtOnce()
        at_once.members(started, where="t.state = %s", params=[str(AttemptState.STARTING)],
                        state=AttemptState.RUNNING, started_at=now)  # fmt: skip
        at_once.moves(JobAttempt, attempts, expect=attempt_sources(AttemptState.RUNNING),
                      state=AttemptState.RUNNING, started_at=now, lease_expires_at=lease)  # fmt: skip
        expect = job_sources(JobState.RUNNING)
        at_once.moves(Job, first, expect=expect, state=JobState.RUNNING, reason=reason,
                      started_at=now)  # fmt: skip
        at_once.moves(Job, again, expect=expect, state=JobState.RUNNING, reason=reason)
        at_once.inserted(JobEvent, job_events())
        at_once.run()

    def settle() -> None:
        for reported, pid in started:
            member = reported.member
            member.state, member.pid, member.started_at = AttemptState.RUNNING, pid, now
            moved(member.attempt, to=AttemptState.RUNNING, started_at=now, lease_expires_at=lease)
        for (actor, fresh), pairs in moves.items():
            fields: dict[str, Any] = {"started_at": now} if fresh else {}
            moved_jobs(pairs, to=JobState.RUNNING, actor=actor, reason=reason, **fields)

    _together(members, write, settle)


def members_finished_together(finished: list[ReportedMember]) -> None:
    """member_finished(reported, exit_code=0) for each (each passed services.ends_plainly): the members,
    attempts and jobs succeeded, the members' GPUs released, one dispatch pass asked for; all or
    none, as members_started_together."""
    now = timezone.now()
    members = [reported.member for reported in finished]
    attempts = [member.attempt for member in members]
    reason = "exit code 0"
    ended: dict[str, Any] = {"exit_code": 0, "progress": 1.0, "finished_at": now}
    moves = _by_actor(members, lambda job: True)

    def job_events() -> list[JobEvent]:
        return _events(moves, to=JobState.SUCCEEDED, reason=reason)

    def write() -> None:
        if connection.vendor == "postgresql":
            return write_at_once()
        rows = AttemptMember.objects.filter(pk__in=[m.pk for m in members], ended_at=None)
        update_all(rows, len(members), state=AttemptState.SUCCEEDED, exit_code=0, ended_at=now)
        _release_gpus(members, now)
        move_attempts(attempts, to=AttemptState.SUCCEEDED, ended_at=now, reason="", exit_code=0)
        move_jobs([a.job for a in attempts], to=JobState.SUCCEEDED, expect=JOB_PLACED, reason=reason,
                  **ended)  # fmt: skip
        JobEvent.objects.bulk_create(job_events())

    def write_at_once() -> None:  # the same updates, one statement (_AtOnce)
        check_attempt_move(attempt_sources(AttemptState.SUCCEEDED), AttemptState.SUCCEEDED)
        check_job_move(JOB_PLACED, JobState.SUCCEEDED)
        at_once = _AtOnce()
        at_once.members([(r, None) for r in finished], where="t.ended_at IS NULL",
                        state=AttemptState.SUCCEEDED, exit_code=0, ended_at=now)  # fmt: skip
        at_once.released(members, now)
        at_once.moves(JobAttempt, attempts, expect=attempt_sources(AttemptState.SUCCEEDED),
                      state=AttemptState.SUCCEEDED, ended_at=now, reason="", exit_code=0)  # fmt: skip
        at_once.moves(Job, [a.job for a in attempts], expect=JOB_PLACED, state=JobState.SUCCEEDED,
                      reason=reason, **ended)  # fmt: skip
        at_once.inserted(JobEvent, job_events())
        at_once.run()

    def settle() -> None:
        for member in members:
            member.state, member.exit_code, member.ended_at = AttemptState.SUCCEEDED, 0, now
            moved(member.attempt, to=AttemptState.SUCCEEDED, ended_at=now, reason="", exit_code=0)
        with dependencies.decided_together():  # one read finds the dependents of them all
            for (actor, _), pairs in moves.items():
                moved_jobs(pairs, to=JobState.SUCCEEDED, actor=actor, reason=reason, **ended)
        trigger_dispatch()

    _together(members, write, settle)


def members_ran_together(ran: list[tuple[ReportedMember, int]]) -> None:
    """member_started(reported, pid=pid) then member_finished(reported, exit_code=0) for each pair
    (each passed services.starts_plainly and services.ends_plainly: a quick job's start and
    clean end, which the agents send in one call): each row goes from `starting` to `succeeded`
    in one guarded update standing for both moves (its version up by two), both audit events
    written. A drain's calls mostly carry one such job: 8 statements fewer than the two services,
    for a group of one too; all or none, as members_started_together."""
    now, lease, members, attempts, first, again = _starting(ran)
    started, reason = "all members started", "exit code 0"
    ended: dict[str, Any] = {"exit_code": 0, "progress": 1.0, "finished_at": now}
    attempt_fields: dict[str, Any] = {"started_at": now, "lease_expires_at": lease,
                                      "ended_at": now, "reason": "", "exit_code": 0}  # fmt: skip
    moves = _by_actor(members, lambda job: job.started_at is None)
    through = (JobState.RUNNING, started)

    def job_events() -> list[JobEvent]:
        return _events(moves, to=JobState.SUCCEEDED, reason=reason, through=through)

    def write() -> None:
        if connection.vendor == "postgresql":
            return write_at_once()
        rows = AttemptMember.objects.filter(
            pk__in=[m.pk for m in members], state=AttemptState.STARTING, ended_at=None
        )
        update_all(rows, len(members), state=AttemptState.SUCCEEDED, pid=_per_member(ran),
                   started_at=now, exit_code=0, ended_at=now)  # fmt: skip
        _release_gpus(members, now)
        move_attempts(attempts, to=AttemptState.SUCCEEDED, expect=[AttemptState.STARTING],
                      steps=2, **attempt_fields)  # fmt: skip
        # The start's move's sources, which reach the end through `running` (states.py).
        expect = [JobState.STARTING]
        if first:
            move_jobs(first, to=JobState.SUCCEEDED, expect=expect, reason=reason, steps=2,
                      started_at=now, **ended)  # fmt: skip
        if again:
            move_jobs(again, to=JobState.SUCCEEDED, expect=expect, reason=reason, steps=2, **ended)
        JobEvent.objects.bulk_create(job_events())

    def write_at_once() -> None:  # the same updates, one statement (_AtOnce)
        check_attempt_move([AttemptState.STARTING], AttemptState.SUCCEEDED)
        check_job_move([JobState.STARTING], JobState.SUCCEEDED)
        at_once = _AtOnce()
        at_once.members(ran, where="t.state = %s AND t.ended_at IS NULL",
                        params=[str(AttemptState.STARTING)], state=AttemptState.SUCCEEDED,
                        started_at=now, exit_code=0, ended_at=now)  # fmt: skip
        at_once.released(members, now)
        at_once.moves(JobAttempt, attempts, expect=[AttemptState.STARTING],
                      state=AttemptState.SUCCEEDED, steps=2, **attempt_fields)  # fmt: skip
        expect = [JobState.STARTING]
        at_once.moves(Job, first, expect=expect, state=JobState.SUCCEEDED, reason=reason, steps=2,
                      started_at=now, **ended)  # fmt: skip
        at_once.moves(Job, again, expect=expect, state=JobState.SUCCEEDED, reason=reason, steps=2,
                      **ended)  # fmt: skip
        at_once.inserted(JobEvent, job_events())
        at_once.run()

    def settle() -> None:
        for reported, pid in ran:
            member = reported.member
            member.state, member.pid, member.started_at = AttemptState.SUCCEEDED, pid, now
            member.exit_code, member.ended_at = 0, now
            moved(member.attempt, to=AttemptState.SUCCEEDED, steps=2, **attempt_fields)
        with dependencies.decided_together():
            for (actor, fresh), pairs in moves.items():
                fields: dict[str, Any] = {"started_at": now} if fresh else {}
                moved_jobs(pairs, to=JobState.SUCCEEDED, actor=actor, reason=reason,
                           through=through, **fields, **ended)  # fmt: skip
        trigger_dispatch()

    _together(members, write, settle)


class _AtOnce:
    """A group's guarded updates as one statement on PostgreSQL, each a data-modifying CTE (the
    rows matched to their read through `unnest` of the ids, versions and pids): one round trip
    for the group where the ORM's updates took one a table, and no compilation of each. The
    updates and their guards are those of the ORM's path beside each use (the tests hold the
    rows the two leave equal); each names the rows it must change, and fewer changed is
    BatchRefused, as update_all's. A refusal leaves what the statement wrote to the caller's
    rollback of the whole call (`_together`)."""

    def __init__(self) -> None:
        self.parts: list[str] = []
        self.params: list[Any] = []
        self.counts: list[int | None] = []  # rows each must change; None: any

    def members(self, pids: Sequence[tuple[ReportedMember, int | None]], *, where: str,
                params: Sequence[Any] = (), **sets: Any) -> None:  # fmt: skip
        """The members' rows, each with its pid when one is given."""
        rows: dict[str, list] = {"id": [r.member.pk for r, _ in pids]}
        if pids[0][1] is not None:
            rows["pid"] = [pid for _, pid in pids]
        self._update(AttemptMember, rows, ["id"], where, params, sets, count=len(pids))

    def moves(self, model: type[Job] | type[JobAttempt], rows: Sequence[Job | JobAttempt], *,
              expect: Sequence[str], steps: int = 1, **sets: Any) -> None:  # fmt: skip
        """move_jobs' or move_attempts' update: each row at the version it was read at, still in
        one of `expect`, its version up by `steps`."""
        if not rows:
            return
        if "reason" in sets:
            sets["reason"] = sets["reason"][:300]
        matched: dict[str, list] = {
            "id": [r.pk for r in rows],
            "version": [r.version for r in rows],
        }
        self._update(model, matched, ["id", "version"], "t.state = ANY(%s)", [[str(e) for e in expect]],
                     sets, count=len(rows), version_steps=steps)  # fmt: skip

    def released(self, members: Sequence[AttemptMember], now: Any) -> None:
        """_release_gpus' update (its count not checked: as the ORM's)."""
        table = connection.ops.quote_name(GpuAllocation._meta.db_table)
        self.parts.append(f"UPDATE {table} SET released_at = %s WHERE attempt_id = ANY(%s) "
                          "AND released_at IS NULL RETURNING 1")  # fmt: skip
        self.params += [now, [m.attempt_id for m in members]]
        self.counts.append(None)

    def inserted(self, model: type[JobEvent], rows: Sequence[JobEvent]) -> None:
        """bulk_create's insert of `rows` (every column but the primary key, each value as the
        field saves it), all of which must go in."""
        fields = [f for f in model._meta.concrete_fields if not f.primary_key]
        self.parts.append(_insert_sql(model, tuple(f.name for f in fields)))
        self.params += [
            [f.get_db_prep_save(f.pre_save(row, True), connection) for row in rows] for f in fields
        ]
        self.counts.append(len(rows))

    def run(self) -> None:
        ctes = ", ".join(f"u{i} AS ({part})" for i, part in enumerate(self.parts))
        counts = ", ".join(f"(SELECT count(*) FROM u{i})" for i in range(len(self.parts)))
        with prepared_cursor() as cursor:
            cursor.execute(f"WITH {ctes} SELECT {counts}", self.params)
            changed = cursor.fetchone()
        if any(
            want is not None and got != want for want, got in zip(self.counts, changed, strict=True)
        ):
            raise BatchRefused

    def _update(self, model, rows: dict[str, list], match: list[str], where: str,
                where_params: Sequence[Any], sets: dict[str, Any], *, count: int,
                version_steps: int = 0) -> None:  # fmt: skip
        self.parts.append(
            _update_sql(model, tuple(rows), tuple(match), where, tuple(sets), version_steps)
        )
        values = [v.value if isinstance(v, Enum) else v for v in sets.values()]  # a state's text
        self.params += [*values, *rows.values(), *where_params]
        self.counts.append(count)


# Each statement's text, written once for its shape (the same few on every call).


@cache
def _update_sql(model, rows: tuple[str, ...], match: tuple[str, ...], where: str,
                sets: tuple[str, ...], version_steps: int) -> str:  # fmt: skip
    """`_AtOnce._update`'s: `model`'s rows matched to `unnest` of the arrays `rows` names (those
    in `match` matched, the others assigned), `sets` assigned, `where` the guard."""
    quote = connection.ops.quote_name
    fields = {name: model._meta.get_field(name) for name in rows}
    unnest = ", ".join(f"%s::{f.rel_db_type(connection)}[]" for f in fields.values())
    columns = ", ".join(quote(f.column) for f in fields.values())
    assigned = [f"{quote(model._meta.get_field(n).column)} = %s" for n in sets]
    assigned += [f"{quote(fields[n].column)} = v.{quote(fields[n].column)}"
                 for n in rows if n not in match]  # fmt: skip
    if version_steps:
        assigned.append(f"version = t.version + {int(version_steps)}")
    joined = " AND ".join(f"t.{quote(fields[n].column)} = v.{quote(fields[n].column)}"
                          for n in match)  # fmt: skip
    return (
        f"UPDATE {quote(model._meta.db_table)} AS t SET {', '.join(assigned)} "
        f"FROM unnest({unnest}) AS v({columns}) WHERE {joined} AND {where} RETURNING 1"
    )


@cache
def _insert_sql(model: type[JobEvent], names: tuple[str, ...]) -> str:
    """`_AtOnce.inserted`'s: rows of `model` from `unnest` of one array a column."""
    quote = connection.ops.quote_name
    fields = [cast(Field, model._meta.get_field(name)) for name in names]
    columns = ", ".join(quote(f.column) for f in fields)
    unnest = ", ".join(f"%s::{f.db_type(connection)}[]" for f in fields)
    return f"INSERT INTO {quote(model._meta.db_table)} ({columns}) SELECT * FROM unnest({unnest}) RETURNING 1"


def _events(moves: dict, **move: Any) -> list[JobEvent]:
    """The audit events of `_by_actor`'s groups of job moves, each group's with its actor."""
    return [event for (actor, _), pairs in moves.items()
            for event in move_events(pairs, actor=actor, **move)]  # fmt: skip


def _per_member(pids: list[tuple[ReportedMember, int]]):
    """The members' pids as one update's value: a CASE on the member for several."""
    if len(pids) == 1:
        return pids[0][1]
    return Case(*(When(pk=reported.member.pk, then=Value(pid)) for reported, pid in pids),
                output_field=IntegerField())  # fmt: skip


def _release_gpus(members: list[AttemptMember], now) -> None:
    """The members' GPUs released, in one update: each is its attempt's only member (the rules
    admit no gang), so all its attempt's GPUs are its own, on its node, and no join to the
    GPUs' nodes is needed (member_finished's, for a gang's member)."""
    GpuAllocation.objects.filter(
        attempt_id__in=[member.attempt_id for member in members], released_at=None
    ).update(released_at=now)


def _by_actor(members: Iterable[AttemptMember], key: Callable[[Job], bool]) -> dict:
    """(job, attempt) pairs grouped by their event's actor (the member's node) and `key(job)`."""
    groups: dict = defaultdict(list)
    for member in members:
        attempt = member.attempt
        groups[(f"agent:{member.node.name}", key(attempt.job))].append((attempt.job, attempt))
    return groups


def _together(members: list[AttemptMember], write: Callable[[], None],
              settle: Callable[[], None]) -> None:  # fmt: skip
    """Run `write` then `settle` in the caller's transaction, with no savepoint of their own (two
    round trips fewer on PostgreSQL). A refusal (a row moved) or an error leaves that transaction
    to be rolled back whole: BatchRefused goes up, and the caller runs its call again with every
    report applied alone (apps/nodes/agent_reports.py); a deadlock PostgreSQL broke goes up as
    itself, to the call's retry."""
    try:
        with transaction.atomic(savepoint=False):
            write()
            settle()
    except BatchRefused:
        log.info("a batch of %d reports meets rows that moved; applied one by one", len(members))
        raise
    except DatabaseError as error:
        if retryable(error):
            raise
        log.exception("a batch of %d reports failed; applied one by one", len(members))
        raise BatchRefused from error
    except Exception as error:
        log.exception("a batch of %d reports failed; applied one by one", len(members))
        raise BatchRefused from error
