"""Every change to a job goes through here: submit, cancel, requeue, and what agents report.

Each transition is a guarded update (`filter(pk, state in expected, version).update(...)`)
that checks exactly one row changed, plus an audit event. Agent reports carry the attempt's
fencing token; a report for a superseded attempt changes nothing. A service that is a
transaction of its own runs again whole when PostgreSQL aborts it to break a deadlock
(`retried`, apps/platform/retry.py; docs/reliability.md "Concurrency").

The guarded moves themselves live in apps/jobs/transitions.py and the dispatcher's placement in
apps/jobs/placement.py; their public names are importable from here too.
"""

from __future__ import annotations

import hashlib
import logging
import uuid
from collections.abc import Iterable
from dataclasses import dataclass, field
from dataclasses import fields as dataclass_fields
from datetime import timedelta
from functools import cache
from itertools import accumulate
from typing import cast

from django.conf import settings
from django.core.files import File
from django.core.files.storage import default_storage
from django.db import DEFAULT_DB_ALIAS, connection, connections, transaction
from django.db.models import F, Field
from django.utils import timezone

from apps.jobs.models import (
    ATTEMPT_ACTIVE,
    JOB_ACTIVE,
    JOB_PLACED,
    JOB_TERMINAL,
    Artifact,
    AttemptMember,
    AttemptState,
    DependencyState,
    GpuAllocation,
    Job,
    JobAttempt,
    JobDependency,
    JobEvent,
    JobState,
    JobTemplate,
)
from apps.jobs.placement import (  # noqa: F401  (re-exported: callers import them from here)
    JobPlacement,
    MemberPlacement,
    job_place,
    jobs_place,
)
from apps.jobs.states import attempt_sources, job_sources
from apps.jobs.transitions import (  # noqa: F401  (re-exported, as above)
    log_move,
    new_event,
    record_event,
    transition_attempt,
    transition_job,
    trigger_dispatch,
)
from apps.nodes.models import GpuSku, Node
from apps.platform import events
from apps.platform.db import Reader, among, column, prepared_cursor, table
from apps.platform.errors import (  # callers import them from here too
    NotAllowed,
    QueueFull,
    ServiceError,
)
from apps.platform.names import EndReason, StopReason
from apps.platform.retry import retried
from apps.tenants.models import Quota, Tenant, Tier

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class JobSpec:
    """A validated submission (the API's input serializer builds it). Each field is the Job
    field of that name (`new_job` copies them all): a new one with a default needs a line here,
    on the model and in apps/jobs/serializers.py, nowhere else (docs/architecture.md)."""

    name: str
    tier: Tier
    template: JobTemplate | None
    params: dict
    command: list[str] | None
    gpus: int
    nodes: int
    gpu_sku: GpuSku | None
    node_selector: dict
    max_runtime_seconds: int
    checkpointable: bool
    cacheable: bool
    retry_on_failure: bool = False  # retry a user error too (infrastructure failures always are)
    # Cgroup limits per member (0: the node's default); the body's, else the template's.
    memory_mib: int = 0
    pids_max: int = 0
    cpu_weight: int = 0
    # Own code (docs/own-code.md): a bundle's sha256 ("" none), environment variables, secret
    # names, {"requirements": [...]}.
    bundle: str = ""
    env: dict = field(default_factory=dict)
    secrets: list = field(default_factory=list)
    python: dict = field(default_factory=dict)
    # An OCI image (docs/images.md): its reference ("" none) and the secret naming its
    # registry's credentials ("" none).
    image: str = ""
    image_pull_secret: str = ""
    # An interactive job (docs/interactive.md) and its idle timeout (0: its tier's).
    interactive: bool = False
    idle_timeout_minutes: float = 0


SPEC_FIELDS = tuple(f.name for f in dataclass_fields(JobSpec))  # each a field of Job of that name


# --- submit, cancel, requeue ----------------------------------------------------------------


def tenant_limits(tenant: Tenant) -> dict:
    quota, _ = Quota.objects.get_or_create(tenant=tenant)
    quota.tenant = tenant
    return quota.effective()


def check_allowed(tenant: Tenant, spec: JobSpec) -> None:
    """What the tenant may submit at all: its tier or below, commands only where allowed (any
    tenant may run a command in its own bundle: `allow_commands` is for commands outside one)."""
    if spec.tier.rank > tenant.tier.rank:
        raise NotAllowed(
            f"tenant {tenant.slug} may not submit at tier {spec.tier.name}", field="tier"
        )
    if spec.interactive and not tenant.allow_commands:
        raise NotAllowed(
            f"tenant {tenant.slug} may not run interactive jobs (they run commands)",
            field="interactive",
        )
    idle_limit = spec.tier.interactive_idle_minutes
    if spec.interactive and spec.idle_timeout_minutes > idle_limit:
        raise ServiceError(
            f"at most {idle_limit} minutes at tier {spec.tier.name}", field="idle_timeout_minutes"
        )
    if spec.command is not None and not spec.bundle and not tenant.allow_commands:
        raise NotAllowed(
            f"tenant {tenant.slug} may only run templates, or commands in a bundle", field="command"
        )


def queue_full(tenant: Tenant, queued: int, limits: dict) -> QueueFull:
    return QueueFull(
        f"tenant {tenant.slug} has {queued} of {limits['max_queued_jobs']} jobs queued",
        retry_after=30,
    )


def new_job(*, tenant: Tenant, user, spec: JobSpec) -> tuple[Job, JobEvent]:
    """The queued job of a submission and its audit event, not yet saved. Every field of the
    spec is the job's field of that name (tests/admission/test_submit_job.py holds it so)."""
    job = Job(tenant=tenant, user=user, reason="waiting for the dispatcher", **spec_fields(spec))
    event = JobEvent(
        job=job, actor=f"user:{user.username}", reason="submitted", to_state=JobState.QUEUED
    )
    return job, event


def spec_fields(spec: JobSpec) -> dict:
    return {name: getattr(spec, name) for name in SPEC_FIELDS}


PROGRESS_SAMPLES = 20


def active_attempt(job: Job) -> JobAttempt | None:
    return job.attempts.filter(state__in=ATTEMPT_ACTIVE).order_by("-number").first()


@retried
@transaction.atomic
def job_cancel(*, job: Job, actor: str, reason: str = "cancelled by user") -> Job:
    """Cancel a queued or placed job. The job is `cancelled` at once; a running attempt is told
    to stop and its GPUs are released when its agent reports the process tree gone."""
    job = Job.objects.select_for_update().get(pk=job.pk)
    if job.state not in JOB_ACTIVE:
        raise ServiceError(f"job already {job.state}", field="state")  # "already succeeded"
    attempt = active_attempt(job)
    now = timezone.now()
    if not transition_job(job, to=JobState.CANCELLED, actor=actor, reason=reason, finished_at=now,
                          attempt=attempt):  # fmt: skip
        raise ServiceError("job changed while cancelling; try again", field="state")
    if attempt is not None:
        request_stop(attempt, why=StopReason.CANCEL)
    trigger_dispatch()
    return job


def request_stop(attempt: JobAttempt, *, why: str) -> None:
    """Ask the agents running `attempt` to stop it (a StopRequested per member: a message on
    commit, the agents' heartbeat poll as a backstop)."""
    JobAttempt.objects.filter(pk=attempt.pk).update(stop_requested=why)
    attempt.stop_requested = why
    for member in attempt.members.select_related("node"):
        events.emit(events.StopRequested(attempt=attempt, member=member))


@retried
@transaction.atomic
def job_requeue(*, job: Job, actor: str, reason: str) -> Job:
    """Support staff: put a finished or stuck job back in the queue with a new attempt to come."""
    job = Job.objects.select_for_update().get(pk=job.pk)
    had_ended = job.state in JOB_TERMINAL
    attempt = active_attempt(job)
    if attempt is not None:
        request_stop(attempt, why=StopReason.REQUEUE)
        end_attempt(attempt, state=AttemptState.CANCELLED, reason=reason)
    if not transition_job(job, to=JobState.QUEUED, actor=actor, reason=reason, finished_at=None, exit_code=None,
                          progress=0.0, not_before=None):  # fmt: skip
        raise ServiceError("job changed while requeueing; try again", field="state")
    if had_ended:
        events.emit(events.JobRequeued(job=job))
    trigger_dispatch()
    return job


@transaction.atomic
def job_bump_priority(*, job: Job, actor: str, by: int = 1) -> Job:
    """Support staff: move a queued job ahead. Each step counts as PRIORITY_BOOST_SECONDS of
    extra waiting in the policy's order (aging and the order inside its tenant)."""
    Job.objects.filter(pk=job.pk).update(priority_boost=F("priority_boost") + by)
    job.refresh_from_db(fields=["priority_boost"])
    record_event(job, actor=actor, kind="note", reason=f"priority boosted to {job.priority_boost}")
    trigger_dispatch()
    return job


# --- agent reports ------------------------------------------------------------------------


def _lock_job_of(attempt_id: int) -> None:
    """Row-lock the attempt's job for the rest of the transaction (PostgreSQL; SQLite's
    IMMEDIATE transactions already run one at a time)."""
    # One row each: .order_by() leaves out Meta's orderings (attempts by job, jobs by date),
    # whose joins and ORDER BY every report paid for.
    job_id = (
        JobAttempt.objects.filter(pk=attempt_id).order_by().values_list("job_id", flat=True).first()
    )
    if job_id is not None:
        list(
            Job.objects.select_for_update()
            .filter(pk=job_id)
            .order_by()
            .values_list("pk", flat=True)
        )


@dataclass(frozen=True)
class ReportedMember:
    """A member an agent reports on, as the report services act on it: read after its job's row
    lock, in the transaction that changes it, with its attempt, job and node; beside it every
    member of its attempt (`gang`, itself included, sharing one attempt object), so a gang's start
    or end is decided without another read. The services keep these objects current as they
    change the rows, so the next report of the same batch sees what the last one did.

    `awaited`: whether a pending dependency waits on its job (the job as a parent, docs/
    pipelines.md), as read in the same statement. Read after the job's lock, it holds until the
    transaction ends: a submit locks a parent before it writes a dependency on it, and a parent's
    requeue (which reopens them) moves its row (apps/jobs/dependencies.py). A batch's ends
    skip the dependents' read for the jobs no dependency waits on (apps/jobs/batch_reports.py)."""

    member: AttemptMember
    gang: tuple[AttemptMember, ...]
    awaited: bool = True


def lock_reported_members(
    *, attempt_ids: Iterable[int], node_name: str | None = None
) -> dict[tuple[int, int], ReportedMember]:
    """In the caller's transaction: row-lock the jobs of these attempts (in id order, as every
    report does: two transactions never take two jobs' locks in opposite orders; PostgreSQL, as
    job_preempt and job_cancel lock them; SQLite's IMMEDIATE transaction is the lock), then read
    their members. With `node_name`, only attempts with a member on that node are locked and
    only that node's members are returned (an agent's batch). Two statements for a whole batch
    (one on SQLite, whose write transactions run one at a time: there the transaction is the
    lock, as for _lock_job_of), each written once (`_ReportReads`) and prepared on PostgreSQL."""
    ids = sorted(set(attempt_ids))
    if not ids:
        return {}
    reads = _report_reads(connection.vendor)
    with prepared_cursor() as cursor:
        if connection.features.has_select_for_update:  # else (SQLite) the transaction is the lock
            if node_name is None:
                cursor.execute(reads.lock, [ids])
            else:
                cursor.execute(reads.lock_on_node, [ids, node_name])
            cursor.fetchall()
        cursor.execute(*reads.members(ids))
        rows = cursor.fetchall()
    db, gangs = connections[DEFAULT_DB_ALIAS], cast(dict[int, list[AttemptMember]], {})
    awaited: set[int] = set()  # the attempts whose job a pending dependency waits on
    for row in rows:
        member = reads.member_of(row, gangs, db)
        gangs.setdefault(member.attempt_id, []).append(member)
        if row[-1]:
            awaited.add(member.attempt_id)
    return {
        (member.attempt_id, member.rank): ReportedMember(
            member=member, gang=tuple(gang), awaited=member.attempt_id in awaited
        )
        for gang in gangs.values()
        for member in gang
        if node_name is None or member.node.name == node_name
    }


class _ReportReads:
    """lock_reported_members' statements, written once per backend from the models' metadata:
    built by the ORM on every report call they cost the web more CPU than the rest of a quick
    job's call (docs/bench/71-slurm-peer-notes.md, h38reports pass). Their text does not change
    with the batch on PostgreSQL (the ids travel as one array), so psycopg prepares them."""

    def __init__(self, vendor: str):
        self.m, self.a = Reader(AttemptMember, "m"), Reader(JobAttempt, "a")
        self.j, self.n = Reader(Job, "j"), Reader(Node, "n")
        # each model's slice of a row: the select's columns are m's, a's, j's, then n's
        stops = list(accumulate(r.width for r in (self.m, self.a, self.j, self.n)))
        self.slices = [slice(b, e) for b, e in zip([0, *stops], stops, strict=False)]
        member_attempt, job_id = column(AttemptMember, "attempt"), column(Job, "id")
        self.attempt_at = self.m.attnames.index("attempt_id")
        # the members' attempt, the condition on the ids (`members`)
        self.member_attempt = f"m.{member_attempt}"
        self.attempt_field = cast(Field, AttemptMember._meta.get_field("attempt"))
        attempts = f"a.{column(JobAttempt, 'id')} = ANY(%s::bigint[])"
        on_node = (
            f"INNER JOIN {table(AttemptMember)} m ON m.{member_attempt} = a.{column(JobAttempt, 'id')} "
            f"INNER JOIN {table(Node)} n ON n.{column(Node, 'id')} = m.{column(AttemptMember, 'node')} "
        )
        lock = (
            f"SELECT {job_id} FROM {table(Job)} WHERE {job_id} IN (SELECT a.{column(JobAttempt, 'job')} "
            f"FROM {table(JobAttempt)} a {{}}WHERE {attempts}{{}}) ORDER BY {job_id} FOR UPDATE"
        )
        self.lock = lock.format("", "")
        self.lock_on_node = lock.format(on_node, f" AND n.{column(Node, 'name')} = %s")
        # Last, whether a pending dependency waits on the job (the index on its parent and state).
        awaited = (
            f"EXISTS (SELECT 1 FROM {table(JobDependency)} d WHERE d.{column(JobDependency, 'parent_job')}"
            f" = j.{job_id} AND d.{column(JobDependency, 'state')} = %s)"
        )
        self.select = (
            f"SELECT {self.m.columns}, {self.a.columns}, {self.j.columns}, {self.n.columns}, "
            f"{awaited} FROM {table(AttemptMember)} m "
            f"INNER JOIN {table(JobAttempt)} a ON a.{column(JobAttempt, 'id')} = m.{member_attempt} "
            f"INNER JOIN {table(Job)} j ON j.{job_id} = a.{column(JobAttempt, 'job')} "
            f"INNER JOIN {table(Node)} n ON n.{column(Node, 'id')} = m.{column(AttemptMember, 'node')} "
            "WHERE "
        )

    def members(self, ids: list[int]) -> tuple[str, list]:
        """The members of these attempts with their attempts, jobs and nodes, and whether a
        pending dependency waits on the job: the statement and its parameters."""
        attempts, params = among(self.member_attempt, self.attempt_field, ids)
        return f"{self.select}{attempts}", [str(DependencyState.PENDING), *params]

    def member_of(self, row: tuple, gangs: dict[int, list[AttemptMember]], db) -> AttemptMember:
        """The row's member, its node and its attempt (the gang's one attempt object, with its
        job), related through the relations' descriptors."""
        m, a, j, n = self.slices
        member = cast(AttemptMember, self.m.build(row[m], db))
        gang = gangs.get(row[self.attempt_at])
        if gang:
            member.attempt = gang[0].attempt
        else:
            attempt = cast(JobAttempt, self.a.build(row[a], db))
            attempt.job = cast(Job, self.j.build(row[j], db))
            member.attempt = attempt
        member.node = cast(Node, self.n.build(row[n], db))
        return member


@cache
def _report_reads(vendor: str) -> _ReportReads:
    return _ReportReads(vendor)


def _reported(attempt_id: int, rank: int, token: str) -> ReportedMember | None:
    """One member's report (the single endpoints, tests): its job locked, the token checked."""
    reported = lock_reported_members(attempt_ids=[attempt_id]).get((attempt_id, rank))
    if reported is None or not _same_token(reported.member.attempt, token):
        log.warning(
            "report for unknown attempt %s rank %s or stale token; ignored", attempt_id, rank
        )
        return None
    return reported


def _same_token(attempt: JobAttempt, token: str) -> bool:
    try:
        return uuid.UUID(str(token)) == attempt.token
    except ValueError:
        return False


# --- the plain start and the clean end: the rules the batch path (apps/jobs/batch_reports.py) --
# applies several reports at a time by, kept here beside the services whose outcome they predict
# (tests/unit/test_report_rules.py holds the two to the same outcome).


def starts_plainly(reported: ReportedMember) -> bool:
    """Whether member_started would start this member, its attempt and its job without a choice:
    the attempt's only member, all three where a start moves them, as read."""
    member, attempt = reported.member, reported.member.attempt
    return (
        len(reported.gang) == 1
        and member.state == AttemptState.STARTING
        and attempt.state in attempt_sources(AttemptState.RUNNING)
        and attempt.job.state in job_sources(JobState.RUNNING)
    )


def clean_exit(exit_code: int | None, reason: str) -> bool:
    """An end that succeeds its member: exit code 0 and no reason (a stop's, a limit's)."""
    return exit_code == 0 and not reason


def ends_plainly(reported: ReportedMember, *, exit_code: int | None, reason: str,
                 checkpoint: str) -> bool:  # fmt: skip
    """Whether member_finished would end this member, its attempt and its job as succeeded
    without a choice: the attempt's only member, a clean exit, nothing asked to stop, no
    checkpoint to store."""
    member, attempt = reported.member, reported.member.attempt
    return (
        len(reported.gang) == 1
        and member.ended_at is None
        and clean_exit(exit_code, reason)
        and not checkpoint
        and not attempt.stop_requested
        and attempt.state in ATTEMPT_ACTIVE
        and attempt.state in attempt_sources(AttemptState.SUCCEEDED)
        and attempt.job.state in JOB_PLACED
    )


@retried
@transaction.atomic
def attempt_member_started(*, attempt_id: int, rank: int, token: str, pid: int) -> bool:
    reported = _reported(attempt_id, rank, token)
    return reported is not None and member_started(reported, pid=pid)


@transaction.atomic
def member_started(reported: ReportedMember, *, pid: int) -> bool:
    """The member's process runs (`reported`: from lock_reported_members, in this transaction).
    The attempt and the job run once every member of the gang does."""
    member, attempt = reported.member, reported.member.attempt
    if attempt.state not in ATTEMPT_ACTIVE:
        return False
    if member.state == AttemptState.RUNNING and member.pid == pid:
        return True  # this report again: the agent's retry of a call whose answer it lost
    if member.state != AttemptState.STARTING:
        return False
    now = timezone.now()
    if not AttemptMember.objects.filter(pk=member.pk, state=AttemptState.STARTING).update(
        state=AttemptState.RUNNING, pid=pid, started_at=now
    ):
        return False
    member.state, member.pid, member.started_at = AttemptState.RUNNING, pid, now
    if any(other.state != AttemptState.RUNNING for other in reported.gang):
        return True  # a gang starts when its last member is up
    lease = now + timedelta(
        seconds=settings.HEARTBEAT_SECONDS * settings.NODE_LOST_AFTER_HEARTBEATS
    )
    if transition_attempt(attempt, to=AttemptState.RUNNING, started_at=now, lease_expires_at=lease):
        job = attempt.job
        transition_job(job, to=JobState.RUNNING, actor=f"agent:{member.node.name}", reason="all members started",
                       attempt=attempt, started_at=job.started_at or now)  # fmt: skip
    return True


@transaction.atomic
def attempt_progress(*, attempt_id: int, token: str, progress: float, checkpoint: str = "") -> bool:
    attempt = JobAttempt.objects.select_related("job").filter(pk=attempt_id, token=token).first()
    return attempt is not None and _progress(attempt, progress=progress, checkpoint=checkpoint)


@transaction.atomic
def member_progress(reported: ReportedMember, *, progress: float, checkpoint: str = "") -> bool:
    return _progress(reported.member.attempt, progress=progress, checkpoint=checkpoint)


def _progress(attempt: JobAttempt, *, progress: float, checkpoint: str) -> bool:
    if attempt.state not in ATTEMPT_ACTIVE:
        return False
    progress = min(1.0, max(0.0, float(progress)))
    if int(progress * PROGRESS_SAMPLES) > int(attempt.job.progress * PROGRESS_SAMPLES):
        # A sample per 5% for the job page's progress chart (at most 20 rows an attempt).
        record_event(
            attempt.job,
            actor="agent",
            kind="progress",
            attempt=attempt,
            data={"progress": progress},
        )
    if checkpoint:
        # Every progress report that names a checkpoint moves its time: the policy's victim cost
        # is the work done since the last one.
        JobAttempt.objects.filter(pk=attempt.pk).update(
            checkpoint=checkpoint[:500], checkpoint_at=timezone.now()
        )
    Job.objects.filter(pk=attempt.job_id, state__in=JOB_PLACED).update(progress=progress)
    attempt.job.progress = progress
    return True


@retried
@transaction.atomic
def attempt_member_finished(*, attempt_id: int, rank: int, token: str, exit_code: int | None,
                            reason: str = "", checkpoint: str = "", retryable: bool = True) -> bool:  # fmt: skip
    """A member's process tree is gone. Release its GPUs and settle the attempt and the job."""
    reported = _reported(attempt_id, rank, token)
    return reported is not None and member_finished(reported, exit_code=exit_code, reason=reason,
                                                    checkpoint=checkpoint, retryable=retryable)  # fmt: skip


@transaction.atomic
def member_finished(reported: ReportedMember, *, exit_code: int | None, reason: str = "",
                    checkpoint: str = "", retryable: bool = True) -> bool:  # fmt: skip
    """attempt_member_finished for a member read by lock_reported_members in this transaction.
    The job was locked before the read, as job_preempt and job_cancel lock it: a preemption
    committed between our read and the settling would leave the job's version stale, its guarded
    transition would change nothing, and the job would sit in `preempting` until its lease ran
    out."""
    member = reported.member
    if member.ended_at is not None:
        return False
    now = timezone.now()
    ok = clean_exit(exit_code, reason)
    member_state = AttemptState.SUCCEEDED if ok else AttemptState.FAILED
    attempt = member.attempt
    if attempt.stop_requested == StopReason.CANCEL:
        member_state = AttemptState.CANCELLED
    if not AttemptMember.objects.filter(pk=member.pk, ended_at=None).update(
        state=member_state, exit_code=exit_code, ended_at=now
    ):
        return False
    member.state, member.exit_code, member.ended_at = member_state, exit_code, now
    GpuAllocation.objects.filter(
        attempt=attempt, gpu__node_id=member.node_id, released_at=None
    ).update(released_at=now)
    if checkpoint:
        JobAttempt.objects.filter(pk=attempt.pk).update(checkpoint=checkpoint[:500])
        attempt.checkpoint = checkpoint[:500]
    if attempt.state in ATTEMPT_ACTIVE:
        _settle_attempt(attempt, member, ok=ok, exit_code=exit_code, reason=reason,
                        retryable=retryable, gang=reported.gang)  # fmt: skip
    trigger_dispatch()
    return True


def _gang_running(attempt: JobAttempt, gang: Iterable[AttemptMember] | None) -> bool:
    """Whether a member of the attempt has not ended: from `gang` (its members as the report
    services hold them, read under the job's lock) when given, else from the database."""
    if gang is not None:
        return any(member.ended_at is None for member in gang)
    return attempt.members.filter(ended_at=None).exists()


def _settle_attempt(
    attempt: JobAttempt,
    member: AttemptMember,
    *,
    ok: bool,
    exit_code,
    reason: str,
    retryable: bool = True,
    gang: Iterable[AttemptMember] | None = None,
) -> None:
    actor = f"agent:{member.node.name}"
    job = attempt.job
    if attempt.stop_requested == StopReason.CANCEL:
        end_attempt(
            attempt, state=AttemptState.CANCELLED, reason=EndReason.CANCELLED, exit_code=exit_code
        )
        return
    if attempt.stop_requested == StopReason.PREEMPT:
        _settle_preempted(attempt, actor=actor, exit_code=exit_code, gang=gang)
        return
    if ok:
        if _gang_running(attempt, gang):
            if job.interactive:  # its shell exited: the other ranks only hold GPUs, they end too
                stop_rest_of_gang(attempt, why=StopReason.SHELL_EXITED, gang=gang)
            return  # wait for the rest of the gang
        end_attempt(attempt, state=AttemptState.SUCCEEDED, exit_code=0)
        transition_job(job, to=JobState.SUCCEEDED, expect=JOB_PLACED, actor=actor, reason="exit code 0",
                       attempt=attempt, exit_code=0, progress=1.0, finished_at=timezone.now())  # fmt: skip
        return
    why = reason or f"exit code {exit_code}"
    end_attempt(attempt, state=AttemptState.FAILED, reason=why, exit_code=exit_code)
    stop_rest_of_gang(attempt, why=StopReason.GANG_MEMBER_FAILED, gang=gang)
    if job.retry_on_failure and retryable and reason != EndReason.TIMEOUT:
        retry_or_fail(job, attempt, actor=actor, why=why, exit_code=exit_code)
        return
    transition_job(job, to=JobState.FAILED, expect=JOB_PLACED, actor=actor, reason=why, attempt=attempt,
                   exit_code=exit_code, finished_at=timezone.now())  # fmt: skip


def _settle_preempted(
    attempt: JobAttempt, *, actor: str, exit_code, gang: Iterable[AttemptMember] | None = None
) -> None:
    """Every member has stopped: the attempt is `preempted`, the job queued again (it keeps its
    place: the queue orders by original submit time) and resumes from its checkpoint."""
    if _gang_running(attempt, gang):
        return
    job = attempt.job
    end_attempt(
        attempt, state=AttemptState.PREEMPTED, reason=EndReason.PREEMPTED, exit_code=exit_code
    )
    checkpoint = attempt.checkpoint or "none"
    transition_job(job, to=JobState.QUEUED, expect=JOB_PLACED, actor=actor, attempt=attempt,
                   reason=f"preempted; requeued, resumes from checkpoint {checkpoint}",
                   preemption_count=job.preemption_count + 1)  # fmt: skip


@retried
@transaction.atomic
def job_preempt(*, job: Job, actor: str, reason: str, for_job_id: str = "") -> Job:
    """Ask a placed job to checkpoint and stop: its processes get the checkpoint signal, then
    SIGTERM after the tier's grace period, then SIGKILL; it then goes back to the queue."""
    job = Job.objects.select_for_update().get(pk=job.pk)
    attempt = active_attempt(job)
    if job.state not in (JobState.STARTING, JobState.RUNNING) or attempt is None:
        raise ServiceError(
            f"only a starting or running job can be preempted, this one is {job.state}",
            field="state",
        )
    transition_attempt(attempt, to=AttemptState.PREEMPTING, preempted_for=for_job_id)
    if not transition_job(
        job, to=JobState.PREEMPTING, actor=actor, reason=f"preempting: {reason}", attempt=attempt
    ):
        raise ServiceError("job changed while preempting; try again", field="state")
    request_stop(attempt, why=StopReason.PREEMPT)
    return job


def end_attempt(
    attempt: JobAttempt, *, state: str, reason: str = "", exit_code: int | None = None
) -> bool:
    return transition_attempt(
        attempt, to=state, ended_at=timezone.now(), reason=reason[:300], exit_code=exit_code
    )


def stop_rest_of_gang(
    attempt: JobAttempt, *, why: str, gang: Iterable[AttemptMember] | None = None
) -> None:
    if _gang_running(attempt, gang):
        request_stop(attempt, why=why)


@retried
@transaction.atomic
def attempt_lost(*, attempt: JobAttempt, reason: str, actor: str) -> None:
    """Infrastructure failure (node lost, agent restarted): end the attempt and retry the job."""
    _lock_job_of(attempt.pk)
    attempt = JobAttempt.objects.select_related("job").get(pk=attempt.pk)
    if not end_attempt(attempt, state=AttemptState.LOST, reason=reason):
        return
    now = timezone.now()
    # Members that never started run nothing: their GPUs are free now. Running members on live
    # nodes keep theirs until their agent reports the process tree gone.
    never_started = attempt.members.filter(ended_at=None, started_at=None)
    nodes = list(never_started.values_list("node_id", flat=True))
    never_started.update(state=AttemptState.LOST, ended_at=now)
    GpuAllocation.objects.filter(attempt=attempt, gpu__node_id__in=nodes, released_at=None).update(
        released_at=now
    )
    stop_rest_of_gang(attempt, why=StopReason.LOST)
    job = attempt.job
    if job.state not in JOB_PLACED:
        return
    retry_or_fail(job, attempt, actor=actor, why=reason)
    trigger_dispatch()


@retried
@transaction.atomic
def attempt_orphaned(*, attempt_id: int, actor: str) -> bool:
    """Settle an attempt still active although all its members ended (a report whose write
    lost a race): a preemption requeues the job, a cancel ends the attempt, anything else is an
    infrastructure loss (retried). False when there was nothing to settle."""
    _lock_job_of(attempt_id)
    attempt = JobAttempt.objects.select_related("job").get(pk=attempt_id)
    if attempt.state not in ATTEMPT_ACTIVE or attempt.members.filter(ended_at=None).exists():
        return False
    if attempt.stop_requested == StopReason.PREEMPT:
        _settle_preempted(attempt, actor=actor, exit_code=None)
    elif attempt.stop_requested == StopReason.CANCEL:
        end_attempt(attempt, state=AttemptState.CANCELLED, reason=EndReason.CANCELLED)
    else:
        attempt_lost(attempt=attempt, reason=EndReason.NOT_SETTLED, actor=actor)
    trigger_dispatch()
    return True


def retry_backoff(failures: int) -> float:
    """Seconds the n-th retry waits: base, 2 x base, 4 x base, ..., at most the max."""
    return min(
        settings.RETRY_BACKOFF_MAX_SECONDS,
        settings.RETRY_BACKOFF_SECONDS * 2 ** max(0, failures - 1),
    )


def retry_or_fail(
    job: Job, attempt: JobAttempt, *, actor: str, why: str, exit_code: int | None = None
) -> bool:
    """After a failed try: queue the job again behind its backoff, or fail it once it has failed
    MAX_ATTEMPTS times. Preempted and cancelled attempts are not failures and do not count."""
    failures = job.attempts.filter(state__in=[AttemptState.LOST, AttemptState.FAILED]).count()
    now = timezone.now()
    if failures >= settings.MAX_ATTEMPTS:
        return transition_job(job, to=JobState.FAILED, expect=JOB_PLACED, actor=actor, attempt=attempt,
                              reason=f"{why}; gave up after {failures} failed attempts", exit_code=exit_code,
                              finished_at=now)  # fmt: skip
    delay = retry_backoff(failures)
    not_before = now + timedelta(seconds=delay)
    return transition_job(job, to=JobState.QUEUED, expect=JOB_PLACED, actor=actor, attempt=attempt,
                          reason=f"{why}; retry {failures} of {settings.MAX_ATTEMPTS - 1} after {delay:g}s backoff "
                                 f"(not before {not_before:%H:%M:%S} UTC)",
                          not_before=not_before)  # fmt: skip


@retried
@transaction.atomic
def attempt_member_lost(*, attempt_id: int, rank: int, token: str, reason: str) -> bool:
    """The agent could not run or keep a member (agent stopping, launch impossible): an
    infrastructure failure, so the job is retried rather than failed."""
    reported = _reported(attempt_id, rank, token)
    return reported is not None and member_lost(reported, reason=reason)


@transaction.atomic
def member_lost(reported: ReportedMember, *, reason: str) -> bool:
    """attempt_member_lost for a member read by lock_reported_members in this transaction."""
    member = reported.member
    if member.ended_at is not None:
        return False
    now = timezone.now()
    if not AttemptMember.objects.filter(pk=member.pk, ended_at=None).update(
        state=AttemptState.LOST, ended_at=now
    ):
        return False
    member.state, member.ended_at = AttemptState.LOST, now
    GpuAllocation.objects.filter(
        attempt_id=member.attempt_id, gpu__node_id=member.node_id, released_at=None
    ).update(released_at=now)
    if member.attempt.state in ATTEMPT_ACTIVE:
        attempt_lost(attempt=member.attempt, reason=reason, actor=f"agent:{member.node.name}")
    trigger_dispatch()
    return True


def artifact_store(*, attempt_id: int, token: str, name: str, path=None, source=None) -> bool:
    """Save a file the job wrote as one of its artifacts (through the storage API): from `path`,
    or from `source`, an open binary file (the agent API's upload, read from its start)."""
    attempt = JobAttempt.objects.filter(pk=attempt_id, token=token).first()
    if attempt is None:
        return False
    digest, size = hashlib.sha256(), 0
    handle = open(path, "rb") if source is None else source  # noqa: SIM115 (closed below when ours)
    try:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
            size += len(chunk)
        storage_name = f"artifacts/{attempt.job_id}/{name}"
        if default_storage.exists(storage_name):
            default_storage.delete(storage_name)
        handle.seek(0)
        saved = default_storage.save(storage_name, File(handle))
    finally:
        if source is None:
            handle.close()
    Artifact.objects.update_or_create(
        job_id=attempt.job_id, name=name,
        defaults={"attempt": attempt, "file": saved, "size": size, "sha256": digest.hexdigest()},
    )  # fmt: skip
    return True
