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
group on PostgreSQL. The statements are written once for their shape (`_Writes`), the same on
both backends but for how the rows travel; on PostgreSQL a group's updates and its events' insert
are one statement: a quick job's start and end take the call's lock, its read, and that statement
(5 statements with BEGIN and COMMIT, 12 before; the read says whether a dependency waits on each
job, so the ends of the jobs none waits on read no dependents). The objects change only once all
was written.
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
from django.db import DEFAULT_DB_ALIAS, DatabaseError, connection, connections, transaction
from django.db.models import Field
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
    move_events,
    moved,
    moved_jobs,
    trigger_dispatch,
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

    def write() -> None:  # one statement on PostgreSQL (_Writes)
        check_attempt_move(attempt_sources(AttemptState.RUNNING), AttemptState.RUNNING)
        check_job_move(job_sources(JobState.RUNNING), JobState.RUNNING)
        writes = _Writes()
        writes.members(started, where="t.state = %s", params=[str(AttemptState.STARTING)],
                       state=AttemptState.RUNNING, started_at=now)  # fmt: skip
        writes.moves(JobAttempt, attempts, expect=attempt_sources(AttemptState.RUNNING),
                     state=AttemptState.RUNNING, started_at=now, lease_expires_at=lease)  # fmt: skip
        expect = job_sources(JobState.RUNNING)
        writes.moves(Job, first, expect=expect, state=JobState.RUNNING, reason=reason,
                     started_at=now)  # fmt: skip
        writes.moves(Job, again, expect=expect, state=JobState.RUNNING, reason=reason)
        writes.inserted(JobEvent, job_events())
        writes.run()

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

    def write() -> None:  # one statement on PostgreSQL (_Writes)
        check_attempt_move(attempt_sources(AttemptState.SUCCEEDED), AttemptState.SUCCEEDED)
        check_job_move(JOB_PLACED, JobState.SUCCEEDED)
        writes = _Writes()
        writes.members([(r, None) for r in finished], where="t.ended_at IS NULL",
                       state=AttemptState.SUCCEEDED, exit_code=0, ended_at=now)  # fmt: skip
        writes.released(members, now)
        writes.moves(JobAttempt, attempts, expect=attempt_sources(AttemptState.SUCCEEDED),
                     state=AttemptState.SUCCEEDED, ended_at=now, reason="", exit_code=0)  # fmt: skip
        writes.moves(Job, [a.job for a in attempts], expect=JOB_PLACED, state=JobState.SUCCEEDED,
                     reason=reason, **ended)  # fmt: skip
        writes.inserted(JobEvent, job_events())
        writes.run()

    def settle() -> None:
        for member in members:
            member.state, member.exit_code, member.ended_at = AttemptState.SUCCEEDED, 0, now
            moved(member.attempt, to=AttemptState.SUCCEEDED, ended_at=now, reason="", exit_code=0)
        # One read finds the dependents of them all, none for the jobs read as awaited by none.
        with dependencies.decided_together(unawaited=_unawaited(finished)):
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

    def write() -> None:  # one statement on PostgreSQL (_Writes)
        check_attempt_move([AttemptState.STARTING], AttemptState.SUCCEEDED)
        check_job_move([JobState.STARTING], JobState.SUCCEEDED)
        writes = _Writes()
        writes.members(ran, where="t.state = %s AND t.ended_at IS NULL",
                       params=[str(AttemptState.STARTING)], state=AttemptState.SUCCEEDED,
                       started_at=now, exit_code=0, ended_at=now)  # fmt: skip
        writes.released(members, now)
        writes.moves(JobAttempt, attempts, expect=[AttemptState.STARTING],
                     state=AttemptState.SUCCEEDED, steps=2, **attempt_fields)  # fmt: skip
        # The start's move's sources, which reach the end through `running` (states.py).
        expect = [JobState.STARTING]
        writes.moves(Job, first, expect=expect, state=JobState.SUCCEEDED, reason=reason, steps=2,
                     started_at=now, **ended)  # fmt: skip
        writes.moves(Job, again, expect=expect, state=JobState.SUCCEEDED, reason=reason, steps=2,
                     **ended)  # fmt: skip
        writes.inserted(JobEvent, job_events())
        writes.run()

    def settle() -> None:
        for reported, pid in ran:
            member = reported.member
            member.state, member.pid, member.started_at = AttemptState.SUCCEEDED, pid, now
            member.exit_code, member.ended_at = 0, now
            moved(member.attempt, to=AttemptState.SUCCEEDED, steps=2, **attempt_fields)
        with dependencies.decided_together(unawaited=_unawaited(r for r, _ in ran)):
            for (actor, fresh), pairs in moves.items():
                fields: dict[str, Any] = {"started_at": now} if fresh else {}
                moved_jobs(pairs, to=JobState.SUCCEEDED, actor=actor, reason=reason,
                           through=through, **fields, **ended)  # fmt: skip
        trigger_dispatch()

    _together(members, write, settle)


class _Writes:
    """A group's guarded updates and its events' insert, each written once for its shape from the
    models' metadata (nothing compiled on every call), the rows an update names matched to their
    read through a table of their ids, versions and pids: on PostgreSQL `unnest` of one array a
    column, and all of them one statement (data-modifying CTEs: one round trip, its text the same
    whatever the group's size, so it is prepared); on SQLite a `VALUES` list, each its own
    statement (calls in the process there). Each update's guard is the one its service's
    transition checks, and names the rows it must change: fewer changed is BatchRefused, as a
    service's guarded update that changes nothing. A refusal leaves what was written to the
    caller's rollback of the whole call (`_together`)."""

    def __init__(self) -> None:
        # This thread's connection itself, not `connection` (a proxy that looks it up again on
        # every attribute read: each value's conversion reads it).
        self.db = connections[DEFAULT_DB_ALIAS]
        self.postgresql = self.db.vendor == "postgresql"
        self.parts: list[tuple[str, list, int | None]] = []  # statement, parameters, rows it
        # must change (None: any)

    def members(self, pids: Sequence[tuple[ReportedMember, int | None]], *, where: str,
                params: Sequence[Any] = (), **sets: Any) -> None:  # fmt: skip
        """The members' rows, each with its pid when one is given."""
        rows: dict[str, list] = {"id": [r.member.pk for r, _ in pids]}
        if pids[0][1] is not None:
            rows["pid"] = [pid for _, pid in pids]
        self._update(AttemptMember, rows, ("id",), where, params, sets, count=len(pids))

    def moves(self, model: type[Job] | type[JobAttempt], rows: Sequence[Job | JobAttempt], *,
              expect: Sequence[str], steps: int = 1, **sets: Any) -> None:  # fmt: skip
        """transition_job's or transition_attempt's guarded update, for each of `rows`: at the
        version it was read at, still in one of `expect`, its version up by `steps` (2: a start
        and an end written at once)."""
        if not rows:
            return
        if "reason" in sets:
            sets["reason"] = sets["reason"][:300]
        matched: dict[str, list] = {
            "id": [r.pk for r in rows],
            "version": [r.version for r in rows],
        }
        guard, params = self._in("t.state", [str(e) for e in expect])
        self._update(model, matched, ("id", "version"), guard, params, sets, count=len(rows),
                     version_steps=steps)  # fmt: skip

    def released(self, members: Sequence[AttemptMember], now: Any) -> None:
        """The members' GPUs released: each is its attempt's only member (the rules admit no
        gang), so all its attempt's GPUs are its own, on its node, and no join to the GPUs'
        nodes is needed (member_finished's, for a gang's member). Its count is not checked."""
        quote, field = self.db.ops.quote_name, GpuAllocation._meta.get_field("released_at")
        released = quote(cast(Field, field).column)
        guard, params = self._in("attempt_id", [m.attempt_id for m in members])
        self.parts.append((
            f"UPDATE {quote(GpuAllocation._meta.db_table)} SET {released} = %s WHERE {guard} "
            f"AND {released} IS NULL",
            [cast(Field, field).get_db_prep_save(now, self.db), *params], None,
        ))  # fmt: skip

    def inserted(self, model: type[JobEvent], rows: Sequence[JobEvent]) -> None:
        """bulk_create's insert of `rows` (every column but the primary key, each value as the
        field saves it), all of which must go in."""
        fields = [f for f in model._meta.concrete_fields if not f.primary_key]
        values = [
            [f.get_db_prep_save(f.pre_save(row, True), self.db) for row in rows] for f in fields
        ]
        names, size = tuple(f.name for f in fields), 0 if self.postgresql else len(rows)
        params = (
            values if self.postgresql else [v for row in zip(*values, strict=True) for v in row]
        )
        self.parts.append((_insert_sql(model, names, size), params, len(rows)))

    def run(self) -> None:
        if not self.postgresql:
            with self.db.cursor() as cursor:
                for sql, params, count in self.parts:
                    cursor.execute(sql, params)
                    if count is not None and cursor.rowcount != count:
                        raise BatchRefused
            return
        ctes = ", ".join(f"u{i} AS ({sql} RETURNING 1)" for i, (sql, _, _) in enumerate(self.parts))
        counts = ", ".join(f"(SELECT count(*) FROM u{i})" for i in range(len(self.parts)))
        with prepared_cursor(self.db) as cursor:
            cursor.execute(
                f"WITH {ctes} SELECT {counts}", [p for _, params, _ in self.parts for p in params]
            )
            changed = cursor.fetchone()
        wanted = [count for _, _, count in self.parts]
        if any(want is not None and got != want for want, got in zip(wanted, changed, strict=True)):
            raise BatchRefused

    def _in(self, column: str, values: list) -> tuple[str, list]:
        """`column` is one of `values`: one array parameter on PostgreSQL (the same text for any
        count), a list of them on SQLite."""
        if self.postgresql:
            return f"{column} = ANY(%s)", [values]
        return f"{column} IN ({', '.join(['%s'] * len(values))})", values

    def _update(self, model, rows: dict[str, list], match: tuple[str, ...], where: str,
                where_params: Sequence[Any], sets: dict[str, Any], *, count: int,
                version_steps: int = 0) -> None:  # fmt: skip
        meta = model._meta
        row_values = [
            [meta.get_field(name).get_db_prep_save(v, self.db) for v in values]
            for name, values in rows.items()
        ]
        set_values = [meta.get_field(name).get_db_prep_save(v, self.db) for name, v in sets.items()]
        set_values = [v.value if isinstance(v, Enum) else v for v in set_values]  # a state's text
        size = 0 if self.postgresql else count
        sql = _update_sql(model, tuple(rows), match, where, tuple(sets), version_steps, size)
        if self.postgresql:
            params = [*set_values, *row_values, *where_params]
        else:  # the VALUES, row by row, come after the SET's
            params = [*set_values, *(v for row in zip(*row_values, strict=True) for v in row)]
            params += where_params
        self.parts.append((sql, params, count))


# Each statement's text, written once for its shape (the same few on every call; on SQLite one
# for each count of rows).


@cache
def _update_sql(model, rows: tuple[str, ...], match: tuple[str, ...], where: str,
                sets: tuple[str, ...], version_steps: int, size: int) -> str:  # fmt: skip
    """`_Writes._update`'s: `model`'s rows matched to the table `v` of the values `rows` names
    (those in `match` matched, the others assigned; PostgreSQL: `unnest` of one array a column;
    SQLite: `size` rows of VALUES), `sets` assigned, `where` the guard."""
    quote = connection.ops.quote_name
    fields = {name: model._meta.get_field(name) for name in rows}
    columns = ", ".join(quote(f.column) for f in fields.values())
    assigned = [f"{quote(model._meta.get_field(n).column)} = %s" for n in sets]
    assigned += [f"{quote(fields[n].column)} = v.{quote(fields[n].column)}"
                 for n in rows if n not in match]  # fmt: skip
    if version_steps:
        assigned.append(f"version = t.version + {int(version_steps)}")
    joined = " AND ".join(f"t.{quote(fields[n].column)} = v.{quote(fields[n].column)}"
                          for n in match)  # fmt: skip
    update = f"UPDATE {quote(model._meta.db_table)} AS t SET {', '.join(assigned)}"
    if connection.vendor == "postgresql":
        unnest = ", ".join(f"%s::{f.rel_db_type(connection)}[]" for f in fields.values())
        return f"{update} FROM unnest({unnest}) AS v({columns}) WHERE {joined} AND {where}"
    # (Not `WITH v AS (VALUES ...) UPDATE`: Python's sqlite3 counts the rows changed only for a
    # statement that begins with the UPDATE.)
    row = f"({', '.join(['%s'] * len(fields))})"
    named = ", ".join(f"column{i} AS {quote(f.column)}" for i, f in enumerate(fields.values(), 1))
    table = f"(SELECT {named} FROM (VALUES {', '.join([row] * size)}))"
    return f"{update} FROM {table} AS v WHERE {joined} AND {where}"


@cache
def _insert_sql(model: type[JobEvent], names: tuple[str, ...], size: int) -> str:
    """`_Writes.inserted`'s: rows of `model` (PostgreSQL: from `unnest` of one array a column;
    SQLite: `size` rows of VALUES)."""
    quote = connection.ops.quote_name
    fields = [cast(Field, model._meta.get_field(name)) for name in names]
    columns = ", ".join(quote(f.column) for f in fields)
    insert = f"INSERT INTO {quote(model._meta.db_table)} ({columns})"
    if connection.vendor == "postgresql":
        unnest = ", ".join(f"%s::{f.db_type(connection)}[]" for f in fields)
        return f"{insert} SELECT * FROM unnest({unnest})"
    row = f"({', '.join(['%s'] * len(fields))})"
    return f"{insert} VALUES {', '.join([row] * size)}"


def _events(moves: dict, **move: Any) -> list[JobEvent]:
    """The audit events of `_by_actor`'s groups of job moves, each group's with its actor."""
    return [event for (actor, _), pairs in moves.items()
            for event in move_events(pairs, actor=actor, **move)]  # fmt: skip


def _unawaited(reported: Iterable[ReportedMember]) -> set:
    """The ids of the jobs of `reported` that no pending dependency waits on, as read with them
    (services.ReportedMember.awaited): their ends need not look for dependents."""
    return {r.member.attempt.job_id for r in reported if not r.awaited}


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
