"""Job dependencies (docs/pipelines.md): a job submitted with `depends_on` waits, queued but
held back from the dispatcher, until every one of its conditions holds, and fails at once when
one no longer can. Its dependents then follow, in the same transaction: a job never waits for
a parent that will not come.

Conditions on a parent job, decided when the parent reaches a terminal state (the JobEnded
event that `transition_job` emits, handled in the parent's transaction) or at submit, for a
parent that had already ended:

- `afterok`: the parent succeeded.
- `afterany`: the parent ended, whatever its state.
- `afternotok`: the parent failed or was cancelled (as Slurm's, which counts cancelled and
  timed-out jobs; a timeout is a failure here).

A parent that ends and is later requeued by support staff does not undo what its end decided.

Races: the submit locks the parent rows (PostgreSQL: FOR NO KEY UPDATE, the lock a parent's
guarded UPDATE takes) before it reads their states, so a parent that ends meanwhile either ends
first (and the submit reads its end) or waits for the submit to commit (and its JobEnded
handler then reads the new dependency). SQLite runs write transactions one at a time.
"""

from __future__ import annotations

import threading
import uuid
from collections import deque
from dataclasses import dataclass

from django.db import connection
from django.db.models import Q
from django.utils import timezone

from apps.jobs.models import (
    JOB_TERMINAL,
    DependencyCondition,
    DependencyState,
    Job,
    JobDependency,
    JobState,
)
from apps.jobs.services import transition_job, trigger_dispatch
from apps.platform import events
from apps.platform.errors import UnknownObject

FIELD = "depends_on"
MAX_DEPENDENCIES = 64
ACTOR = "system:dependencies"
RELEASED = "waiting for the dispatcher"
CONDITIONS = tuple(c.value for c in DependencyCondition)


@dataclass(frozen=True)
class Wanted:
    """One validated entry of a submit's `depends_on`."""

    kind: str  # "job" (an array after the arrays merge)
    id: uuid.UUID
    condition: str


# --- the rules --------------------------------------------------------------------------------


def verdict(condition: str, parent_state: str) -> str:
    """What a parent job in `parent_state` makes of `condition`: pending until it has ended."""
    if parent_state not in JOB_TERMINAL:
        return DependencyState.PENDING
    if condition == DependencyCondition.AFTERANY:
        return DependencyState.SATISFIED
    if condition == DependencyCondition.AFTERNOTOK:
        ok = parent_state in (JobState.FAILED, JobState.CANCELLED)
    else:  # afterok (and aftercorr, task by task)
        ok = parent_state == JobState.SUCCEEDED
    return DependencyState.SATISFIED if ok else DependencyState.NEVER


def waiting_reason(parent_id, condition: str) -> str:
    return f"waiting for dependency {parent_id} ({condition})"


def failed_reason(parent_id, parent_state: str, condition: str) -> str:
    return f"dependency {parent_id} {parent_state} ({condition})"


# --- submit -----------------------------------------------------------------------------------


def resolve(tenant, wanted: list[Wanted]) -> list[tuple[Job, str]]:
    """The parents of `wanted`, each with its condition, locked for the rest of the transaction
    (see the module's docstring). Another tenant's job, or an unknown id, is 404 naming the field:
    a tenant learns nothing of the others' jobs."""
    ids = {w.id for w in wanted if w.kind == "job"}
    parents = Job.objects.filter(pk__in=ids, tenant=tenant).only("id", "state", "tenant_id")
    if connection.features.has_select_for_update:
        parents = parents.select_for_update(no_key=True)
    found = {job.pk: job for job in parents}
    resolved = []
    for entry in wanted:
        parent = found.get(entry.id) if entry.kind == "job" else None
        if parent is None:
            raise UnknownObject(f"no {entry.kind} {entry.id}", field=FIELD)
        resolved.append((parent, entry.condition))
    return resolved


def hold_at_submit(job: Job, wanted: list[Wanted]) -> None:
    """Mark a job about to be inserted as held by its first dependency (the insert writes it so:
    the dispatcher never sees it unheld before its conditions are read)."""
    job.has_dependencies = job.held_by_dependencies = True
    first = wanted[0]
    job.reason = waiting_reason(first.id, first.condition)


def attach(job: Job, resolved: list[tuple[Job, str]]) -> None:
    """Write a new job's dependencies (in the submit's transaction, the job inserted held) and
    decide the ones whose parents have ended: the job is released, fails, or keeps waiting.
    `job.depends_on_rows` keeps them for the 201 answer."""
    now = timezone.now()
    rows = []
    for position, (parent, condition) in enumerate(resolved):
        state = verdict(condition, parent.state)
        rows.append(JobDependency(job=job, parent_job=parent, condition=condition, position=position, state=state,
                                  decided_at=None if state == DependencyState.PENDING else now))  # fmt: skip
    JobDependency.objects.bulk_create(rows)
    job.depends_on_rows = rows
    parent_states = {parent.pk: parent.state for parent, _ in resolved}
    _settle(job, [(r.parent_job_id, r.condition, r.state) for r in rows], parent_states)


def _settle(job: Job, conditions: list[tuple], parent_states: dict) -> None:
    """Decide a queued dependent from its conditions [(parent id, condition, state)] in order:
    one that can never hold fails it now; else the first pending one is its reason; else it is
    released and a dispatch pass is asked for."""
    never = next((c for c in conditions if c[2] == DependencyState.NEVER), None)
    if never is not None:
        parent_id, condition, _ = never
        reason = failed_reason(parent_id, parent_states.get(parent_id, "ended"), condition)
        _fail(job, reason)
        return
    pending = next((c for c in conditions if c[2] == DependencyState.PENDING), None)
    reason = RELEASED if pending is None else waiting_reason(pending[0], pending[1])
    fields = {"reason": reason[:300], "held_by_dependencies": pending is not None}
    if Job.objects.filter(pk=job.pk, state=JobState.QUEUED).update(**fields):
        for name, value in fields.items():
            setattr(job, name, value)
        if pending is None:
            trigger_dispatch()


def _fail(job: Job, reason: str) -> None:
    for _ in range(3):  # a stale version (a reason written meanwhile): read it again
        if job.state != JobState.QUEUED:
            return
        if transition_job(job, to=JobState.FAILED, expect=[JobState.QUEUED], actor=ACTOR,
                          reason=reason, finished_at=timezone.now(), held_by_dependencies=False):  # fmt: skip
            return
        job.refresh_from_db(fields=["state", "version", "reason", "held_by_dependencies"])


# --- a parent ended ------------------------------------------------------------------------------

_local = threading.local()


def on_job_ended(event: events.JobEnded) -> None:
    """In-transaction handler of JobEnded (subscribed in apps/jobs/apps.py). A dependent failed
    here ends through `transition_job` and so emits JobEnded in turn: those ends are queued and
    settled by the outermost call, one after another, so a long chain fails in one go without
    growing the stack."""
    queue = getattr(_local, "queue", None)
    if queue is not None:
        queue.append(event.job)
        return
    _local.queue = queue = deque([event.job])
    try:
        while queue:
            parent_ended(queue.popleft())
    finally:
        _local.queue = None


def parent_ended(parent: Job) -> int:
    """Decide the pending dependencies on `parent` (ended) and settle their jobs. One read of
    the (parent, state) index finds none for almost every job; returns the dependents settled."""
    deps = list(
        JobDependency.objects.filter(parent_job_id=parent.pk, state=DependencyState.PENDING)
        .values_list("pk", "job_id", "condition")
    )  # fmt: skip
    if not deps:
        return 0
    now = timezone.now()
    by_state: dict[str, list[int]] = {}
    for pk, _, condition in deps:
        by_state.setdefault(verdict(condition, parent.state), []).append(pk)
    for state, pks in by_state.items():
        JobDependency.objects.filter(pk__in=pks).update(state=state, decided_at=now)
    settle_jobs({job_id for _, job_id, _ in deps}, {parent.pk: parent.state})
    return len({job_id for _, job_id, _ in deps})


def settle_jobs(job_ids: set, parent_states: dict) -> None:
    """Settle the queued, held jobs among `job_ids` from their dependencies as stored: those
    now free are released in one statement, the others fail or name their next wait."""
    conditions: dict = {}
    for job_id, parent_id, condition, state in (
        JobDependency.objects.filter(job_id__in=job_ids)
        .exclude(state=DependencyState.SATISFIED)
        .order_by("job_id", "position")
        .values_list("job_id", "parent_job_id", "condition", "state")
    ):
        conditions.setdefault(job_id, []).append((parent_id, condition, state))
    free = [pk for pk in job_ids if pk not in conditions]
    if free and Job.objects.filter(pk__in=free, state=JobState.QUEUED, held_by_dependencies=True).update(
        held_by_dependencies=False, reason=RELEASED
    ):  # fmt: skip
        trigger_dispatch()
    if not conditions:
        return
    waiting = Job.objects.filter(pk__in=list(conditions), state=JobState.QUEUED).filter(
        Q(held_by_dependencies=True)
    )
    for job in waiting:
        _settle(job, conditions[job.pk], parent_states)


# --- reading -----------------------------------------------------------------------------------


def depends_on(job: Job) -> list[dict]:
    """The job's `depends_on` as submitted, each with its state (pending, satisfied, never)."""
    rows = getattr(job, "depends_on_rows", None)
    if rows is None:
        if not job.has_dependencies:
            return []
        rows = job.dependencies.all()  # prefetched by the jobs list
    return [{"job": str(r.parent_job_id), "condition": r.condition, "state": r.state} for r in rows]


def parents_of(job: Job) -> list:
    """The ids of the job's parent jobs, in the order submitted (each once)."""
    seen: dict = {}
    for parent_id in (
        JobDependency.objects.filter(job=job).order_by("position").values_list("parent_job_id", flat=True)
    ):  # fmt: skip
        if parent_id is not None:
            seen.setdefault(parent_id, None)
    return list(seen)


# --- artifacts for pipelines -----------------------------------------------------------------------


def input_artifacts(job: Job) -> list:
    """The artifacts of the job's parents (the same tenant's jobs, by construction), in the
    order the parents were named, then by name: what the job reads as its inputs."""
    from apps.jobs.models import Artifact

    order = {parent_id: i for i, parent_id in enumerate(parents_of(job))}
    if not order:
        return []
    found = Artifact.objects.filter(job_id__in=list(order)).select_related("job")
    return sorted(found, key=lambda a: (order[a.job_id], a.name))


def input_artifact(job: Job, parent_id, name: str):
    """One artifact of one of the job's parents, or None (not a parent, or no such artifact)."""
    from apps.jobs.models import Artifact

    if not JobDependency.objects.filter(job=job, parent_job_id=parent_id).exists():
        return None
    return Artifact.objects.filter(job_id=parent_id, name=name).first()
