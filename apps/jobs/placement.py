"""Placement, called by the dispatcher: a queued job's move to starting with its attempt,
members and GPU allocations, one pass's starts in a fixed number of statements.

The job's guarded update and the partial unique index on GPU allocations are the last word: two
dispatchers racing for one GPU or one job cannot both win.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from functools import cache

from django.conf import settings
from django.db import IntegrityError, connection, transaction
from django.utils import timezone

from apps.jobs.models import AttemptMember, GpuAllocation, Job, JobAttempt, JobEvent, JobState
from apps.jobs.selectors import assignment_of
from apps.jobs.states import check_job_move, job_sources
from apps.jobs.transitions import log_move, new_event
from apps.nodes.models import Node
from apps.platform import events
from apps.platform.db import among, column, prepared_cursor, table
from apps.platform.retry import retried

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class MemberPlacement:
    node_id: int
    gpu_ids: list[int]
    gpu_indices: list[int]


@dataclass(frozen=True)
class JobPlacement:
    """One start: a queued job as the dispatcher read it (its version is the guard), the GPUs
    of each member, and why (the policy's words)."""

    job: Job
    members: list[MemberPlacement]
    why: str = ""


@retried
@transaction.atomic
def job_place(*, job: Job, members: list[MemberPlacement], actor: str = "system:dispatcher",
              why: str = "") -> JobAttempt | None:  # fmt: skip
    """Create the attempt for a queued job on the given GPUs, or return None if the job moved on.

    The job's guarded update and the partial unique index on GPU allocations are the last word:
    two dispatchers racing for one GPU or one job cannot both win (the index raises
    IntegrityError here; `jobs_place` turns it into a refusal of the loser).
    """
    return _place([JobPlacement(job=job, members=members, why=why)], actor=actor).get(job.pk)


@retried  # each of its transactions rolls back whole on an abort: it runs again from the start
def jobs_place(placements: list[JobPlacement], *, actor: str = "system:dispatcher",
               on_lost_race: Callable[[JobPlacement], None] | None = None) -> dict:  # fmt: skip
    """`job_place` for a dispatcher pass's starts, in a fixed number of statements however many
    there are: {job id: its new attempt} for the jobs placed. A job that moved on (cancelled,
    placed by another dispatcher, changing right now) is left out. When another dispatcher took
    one of the GPUs first, the allocation index refuses the whole batch: then each job is placed
    in its own savepoint, so only the loser is refused (and told to `on_lost_race`).

    The batch is a transaction of its own (a savepoint only where the caller holds one), and
    the way back after a refusal another: a transaction around both made the batch's a
    savepoint, two more round trips (SAVEPOINT, RELEASE) before every pass's start message, on
    PostgreSQL each waiting for the server's process (docs/bench/71-slurm-peer-notes.md,
    "h36start pass")."""
    try:
        with transaction.atomic():
            return _place(placements, actor=actor)
    except IntegrityError:
        if len(placements) == 1:
            _lost_race(placements[0], on_lost_race)
            return {}
    placed: dict = {}
    with transaction.atomic():
        for placement in placements:
            try:
                with transaction.atomic():
                    placed.update(_place([placement], actor=actor))
            except IntegrityError:
                _lost_race(placement, on_lost_race)
    return placed


def _lost_race(placement: JobPlacement, on_lost_race) -> None:
    log.info("placement of %s lost a race for its GPUs; retrying next pass", placement.job.pk)
    if on_lost_race is not None:
        on_lost_race(placement)


def _place(placements: list[JobPlacement], *, actor: str) -> dict:
    """The guarded move queued -> starting of every job still at the version read, then their
    attempts, members, GPU allocations and audit events, each kind in one bulk insert. The jobs
    in memory change only once every row is written (an IntegrityError leaves them as read)."""
    check_job_move(job_sources(JobState.STARTING), JobState.STARTING)
    won = _claim_queued([p.job for p in placements])
    placements = [p for p in placements if p.job.pk in won]
    if not placements:
        return {}
    nodes = Node.objects.only("name", "labels", "hostname", "agent_instance").in_bulk(
        {m.node_id for p in placements for m in p.members}
    )
    names = {pk: node.name for pk, node in nodes.items()}
    reasons = {p.job.pk: _placement_reason(p, names) for p in placements}
    _move_to_starting(reasons)
    lease = timezone.now() + timedelta(seconds=settings.STARTING_TIMEOUT_SECONDS)
    attempts = JobAttempt.objects.bulk_create(
        [JobAttempt(job=p.job, number=p.job.attempts_count + 1, lease_expires_at=lease) for p in placements]
    )  # fmt: skip
    pairs = list(zip(placements, attempts, strict=True))
    members = [
        AttemptMember(attempt=attempt, rank=rank, node_id=m.node_id, gpu_indices=m.gpu_indices)
        for p, attempt in pairs
        for rank, m in enumerate(p.members)
    ]
    AttemptMember.objects.bulk_create(members)
    GpuAllocation.objects.bulk_create(
        [GpuAllocation(attempt=attempt, gpu_id=g) for p, attempt in pairs for m in p.members for g in m.gpu_ids]
    )  # fmt: skip
    JobEvent.objects.bulk_create(
        [new_event(p.job, actor=actor, reason=reasons[p.job.pk], from_state=JobState.QUEUED,
                   to_state=JobState.STARTING, attempt=attempt) for p, attempt in pairs]
    )  # fmt: skip
    for p, attempt in pairs:
        job = p.job
        job.state, job.version, job.reason = JobState.STARTING, job.version + 1, reasons[job.pk]
        job.attempts_count = attempt.number
        log_move(job, from_state=JobState.QUEUED, actor=actor, reason=job.reason, attempt=attempt)
        events.emit(events.AttemptPlaced(attempt=attempt, nodes=tuple(names[m.node_id] for m in p.members),
                                         assignments=_assignments(p, attempt, nodes),
                                         agents=tuple(nodes[m.node_id].agent_instance for m in p.members)))  # fmt: skip
    return {p.job.pk: attempt for p, attempt in pairs}


def _assignments(placement: JobPlacement, attempt: JobAttempt, nodes: dict) -> tuple:
    """Each member's assignment, by rank, from the rows just written: what its start message
    carries (apps/scheduling/publish.py). A first attempt resumes from nothing; a later one's
    resume point is left for its agent to look up (None)."""
    leader = nodes[placement.members[0].node_id]
    resume = "" if attempt.number == 1 else None
    return tuple(
        assignment_of(placement.job, attempt, rank=rank, gpu_indices=m.gpu_indices,
                      world_size=len(placement.members), leader=leader, active=True, resume_from=resume)
        for rank, m in enumerate(placement.members)
    )  # fmt: skip


def _placement_reason(placement: JobPlacement, names: dict[int, str]) -> str:
    where = ", ".join(f"{names[m.node_id]}:{m.gpu_indices}" for m in placement.members)
    return (f"placed on {where}" + (f" ({placement.why})" if placement.why else ""))[:300]


START_BATCH = 1000  # jobs moved to starting per UPDATE


def _move_to_starting(reasons: dict) -> None:
    """The claimed jobs' guarded update, each with its own reason: one UPDATE ... FROM (VALUES)
    per START_BATCH jobs. (A CASE over the ids, as the ORM would write it, costs every row a
    walk of the whole list: 8,000 placements took seconds in the database alone.) PostgreSQL and
    SQLite (UPDATE ... FROM since 3.33) both name a VALUES list's columns column1, column2."""
    table, pk = Job._meta.db_table, Job._meta.pk
    quote = connection.ops.quote_name
    rows = [
        (pk.get_db_prep_value(job_id, connection), reason) for job_id, reason in reasons.items()
    ]
    with connection.cursor() as cursor:
        for start in range(0, len(rows), START_BATCH):
            batch = rows[start : start + START_BATCH]
            cursor.execute(
                f"UPDATE {quote(table)} SET state = %s, version = version + 1, "
                "attempts_count = attempts_count + 1, reason = v.column2 "
                f"FROM (VALUES {', '.join(['(%s, %s)'] * len(batch))}) AS v "
                f"WHERE {quote(table)}.{quote(pk.column)} = v.column1 AND state = %s",
                [JobState.STARTING, *(value for row in batch for value in row), JobState.QUEUED],
            )


def _claim_queued(jobs: list[Job]) -> set:
    """The ids of `jobs` still queued at the version read, row-locked for the rest of the
    transaction so the update that follows is theirs alone. A row another transaction holds is
    skipped, not waited for: that job is changing (a cancel, another dispatcher's placement), and
    the next pass sees what it became. (SQLite: the IMMEDIATE transaction is the lock.) Written
    once, as the ORM's `select_for_update(skip_locked=True)` read (in Job's order): built by the
    ORM it was compiled again every pass; on PostgreSQL the ids travel as one array, so the text
    never changes and it is prepared (`prepared_cursor`)."""
    expected = {job.pk: job.version for job in jobs}
    pk = Job._meta.pk
    assert pk is not None
    before, id_column, after = _claim_sql(connection.vendor)
    ids, params = among(id_column, pk, expected)
    with prepared_cursor() as cursor:
        cursor.execute(f"{before}{ids}{after}", params)
        rows = cursor.fetchall()
    claimed = ((pk.to_python(job_id), version) for job_id, version in rows)
    return {job_id for job_id, version in claimed if expected[job_id] == version}


@cache
def _claim_sql(vendor: str) -> tuple[str, str, str]:
    """`_claim_queued`'s statement: before its condition on the ids, the ids' column, after."""
    jobs, states = table(Job), job_sources(JobState.STARTING)
    lock = (
        " FOR UPDATE SKIP LOCKED" if connection.features.has_select_for_update_skip_locked else ""
    )
    sources = ", ".join(f"'{state}'" for state in states)  # code's own constants
    return (
        f"SELECT {jobs}.{column(Job, 'id')}, {jobs}.{column(Job, 'version')} FROM {jobs} "
        f"WHERE {jobs}.{column(Job, 'state')} IN ({sources}) AND ",
        f"{jobs}.{column(Job, 'id')}",
        f" ORDER BY {jobs}.{column(Job, 'created_at')} DESC{lock}",
    )
