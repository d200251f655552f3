"""Job dependencies (docs/pipelines.md): a job submitted with `depends_on` waits, queued but
held back from the dispatcher, until every one of its conditions holds, and fails at once when
one no longer can. Its dependents then follow, in the same transaction: a job never waits for
a parent that will not come.

On a parent job, decided when it reaches a terminal state (the JobEnded event that
`transition_job` emits, handled in the parent's transaction) or at submit when it has already:

- `afterok`: the parent succeeded.
- `afterany`: the parent ended, whatever its state.
- `afternotok`: the parent failed or was cancelled (as Slurm's, which counts cancelled and
  timed-out jobs; a timeout is a failure here).

On a parent job array, over all its tasks, decided as soon as the answer is known:

- `afterok`: every task succeeded; can never hold (the dependent fails) as soon as one task
  fails or is cancelled, without waiting for the others.
- `afterany`: every task ended.
- `afternotok`: a task failed or was cancelled (holds at the first one); can never hold once
  all ended and all succeeded.
- `aftercorr` (the dependent is an array too): task i of the dependent waits for task i of the
  parent array to succeed, and fails if it did not. Every index of the dependent must be one of
  the parent's (else 400).

A job array's conditions are every task's. While one on the whole array (not aftercorr) is
pending, the array is held: no task row is made (apps/admission/arrays.py materialises none)
and the rows made already are held. A task made while the others run has its conditions
settled as it is made (`tasks_made`): that is how aftercorr works with tasks that become rows
lazily. An array whose condition can never hold fails whole: its rows fail and the tasks
without one count as failed (JobArray.failed_reason, as `cancelled_at` for a cancel).

A parent that ends and is later requeued (support staff, an array's requeue-failed) has not
ended any more, as Slurm sees it: the conditions its end decided go back to pending for the
dependents that have not been placed yet (queued, no attempt), which wait again (held) until
it ends again. A dependent that failed on it, or was placed already, stays as it is.

Races: the submit locks the parent rows (PostgreSQL: FOR NO KEY UPDATE, the lock a parent's
guarded UPDATE takes) before it reads their states, so a parent that ends meanwhile either ends
first (and the submit reads its end) or waits for the submit to commit (and its JobEnded
handler then reads the new dependency). SQLite runs write transactions one at a time.
"""

from __future__ import annotations

import threading
import uuid
from collections import deque
from collections.abc import Collection, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from django.db import connection
from django.db.models import F
from django.utils import timezone

from apps.jobs import arrays as array_tasks
from apps.jobs.models import (
    JOB_TERMINAL,
    Artifact,
    DependencyCondition,
    DependencyState,
    Job,
    JobArray,
    JobDependency,
    JobState,
)
from apps.jobs.services import transition_job, trigger_dispatch
from apps.platform import events
from apps.platform.errors import ServiceError, UnknownObject

FIELD = "depends_on"
MAX_DEPENDENCIES = 64
ACTOR = "system:dependencies"
RELEASED = "waiting for the dispatcher"
CONDITIONS = tuple(c.value for c in DependencyCondition)
AFTERCORR = DependencyCondition.AFTERCORR
PENDING, SATISFIED, NEVER = (
    DependencyState.PENDING,
    DependencyState.SATISFIED,
    DependencyState.NEVER,
)
NOT_OK = (JobState.FAILED, JobState.CANCELLED)


@dataclass(frozen=True)
class Wanted:
    """One validated entry of a submit's `depends_on`."""

    kind: str  # "job" or "array"
    id: uuid.UUID
    condition: str


@dataclass(frozen=True)
class Condition:
    """One condition as it stands: on which parent (its kind and id), its state, and the
    parent's state in words (for the reason of a job that fails on it)."""

    kind: str
    parent_id: object
    condition: str
    state: str
    word: str = ""


# --- the rules --------------------------------------------------------------------------------


def verdict(condition: str, parent_state: str) -> str:
    """What a parent job in `parent_state` makes of `condition` (aftercorr: of task i's)."""
    if parent_state not in JOB_TERMINAL:
        return PENDING
    if condition == DependencyCondition.AFTERANY:
        return SATISFIED
    if condition == DependencyCondition.AFTERNOTOK:
        return SATISFIED if parent_state in NOT_OK else NEVER
    return SATISFIED if parent_state == JobState.SUCCEEDED else NEVER


def array_verdict(condition: str, array: JobArray) -> tuple[str, str]:
    """(state, the array's state in words) of a condition on a whole array, from its counts."""
    by_state = array_tasks.counts(array)
    ended = sum(by_state[s] for s in JOB_TERMINAL) == array.size
    not_ok = sum(by_state[s] for s in NOT_OK)
    word = f"failed ({not_ok} of {array.size} tasks did not succeed)" if not_ok else "succeeded"
    if condition == DependencyCondition.AFTERANY:
        return (SATISFIED if ended else PENDING), "ended"
    if condition == DependencyCondition.AFTERNOTOK:
        return (SATISFIED if not_ok else NEVER if ended else PENDING), word
    return (NEVER if not_ok else SATISFIED if ended else PENDING), word


def waiting_reason(kind: str, parent_id, condition: str) -> str:
    what = "array " if kind == "array" else ""
    return f"waiting for dependency {what}{parent_id} ({condition})"


def failed_reason(kind: str, parent_id, word: str, condition: str) -> str:
    what = "array " if kind == "array" else ""
    return f"dependency {what}{parent_id} {word or 'ended'} ({condition})"[:300]


# --- submit -----------------------------------------------------------------------------------


def resolve(tenant, wanted: list[Wanted], *, array=None) -> list[tuple[str, object, str]]:
    """[(kind, the parent Job or JobArray, condition)] of `wanted`, the parents locked for the
    rest of the transaction (see the module's docstring). Another tenant's, or an unknown id, is
    404 naming the field: a tenant learns nothing of the others' jobs. `array`: the dependent's
    ArraySpec when it is an array (aftercorr wants one, and the parent to have its indices)."""
    found: dict = {}
    for kind, model in (("job", Job), ("array", JobArray)):
        ids = {w.id for w in wanted if w.kind == kind}
        if not ids:
            continue
        rows = _locked(model.objects.filter(pk__in=ids, tenant=tenant).order_by("pk"))
        found.update({(kind, row.pk): row for row in rows})
    resolved = []
    for entry in wanted:
        parent = found.get((entry.kind, entry.id))
        if parent is None:
            raise UnknownObject(f"no {entry.kind} {entry.id}", field=FIELD)
        if entry.condition == AFTERCORR:
            _check_corresponding(parent, array)
        resolved.append((entry.kind, parent, entry.condition))
    return resolved


def _check_corresponding(parent: JobArray, array) -> None:
    if array is None:
        raise ServiceError("aftercorr is for an array submit (task i after task i)", field=FIELD)
    theirs = set(array_tasks.spec_of(parent).indices())
    missing = [i for i in array.indices() if i not in theirs]
    if missing:
        raise ServiceError(
            f"aftercorr: array {parent.pk} has no task {missing[0]} ({len(missing)} indices missing)",
            field=FIELD,
        )


def hold_at_submit(job: Job, wanted: list[Wanted]) -> None:
    """Mark a job about to be inserted as held by its first dependency (the insert writes it so:
    the dispatcher never sees it unheld before its conditions are read)."""
    job.has_dependencies = job.held_by_dependencies = True
    first = wanted[0]
    job.reason = waiting_reason(first.kind, first.id, first.condition)


def _rows(resolved, **dependent) -> list[JobDependency]:
    now = timezone.now()
    rows = []
    for position, (kind, parent, condition) in enumerate(resolved):
        state, _ = _parent_verdict(kind, parent, condition)
        rows.append(JobDependency(**dependent, position=position, condition=condition, state=state,
                                  decided_at=None if state == PENDING else now,
                                  **{f"parent_{kind}": parent}))  # fmt: skip
    JobDependency.objects.bulk_create(rows)
    return rows


def _parent_verdict(kind: str, parent, condition: str) -> tuple[str, str]:
    if kind == "job":
        return verdict(condition, parent.state), parent.state
    if condition == AFTERCORR:
        return PENDING, ""  # decided task by task
    return array_verdict(condition, parent)


def attach(job: Job, resolved: list[tuple[str, object, str]]) -> None:
    """Write a new job's dependencies (in the submit's transaction, the job inserted held) and
    decide the ones whose parents have ended: the job is released, fails, or keeps waiting.
    `job.depends_on_rows` keeps them for the 201 answer."""
    rows = _rows(resolved, job=job)
    job.depends_on_rows = rows  # type: ignore[attr-defined]  # the 201 shows them unread
    _settle(job, _conditions(rows))


def attach_array(array: JobArray, resolved: list[tuple[str, object, str]]) -> None:
    """Write a new array's dependencies, before its first task is made (`tasks_made` settles
    each task as it is made): held while a condition on the whole array is pending, failed if
    one can never hold."""
    rows = _rows(resolved, array=array)
    array.has_dependencies = True
    JobArray.objects.filter(pk=array.pk).update(has_dependencies=True)
    _settle_array_fields(array, _conditions([r for r in rows if r.condition != AFTERCORR]))


def _conditions(rows) -> list[Condition]:
    out = []
    for row in rows:
        kind = "job" if row.parent_job_id is not None else "array"
        parent = row.parent_job_id if kind == "job" else row.parent_array_id
        word = ""
        if row.state == NEVER:
            if kind == "job":
                word = Job.objects.filter(pk=parent).values_list("state", flat=True).first() or ""
            else:
                array = JobArray.objects.filter(pk=parent).first()
                word = array_verdict(row.condition, array)[1] if array else ""
        out.append(Condition(kind, parent, row.condition, row.state, word))
    return out


def _settle(job: Job, conditions: list[Condition]) -> None:
    """Decide a queued, held job from its conditions in order: one that can never hold fails it
    now; else the first pending one is its reason; else it is released (and a dispatch pass is
    asked for)."""
    never = next((c for c in conditions if c.state == NEVER), None)
    if never is not None:
        _fail(job, failed_reason(never.kind, never.parent_id, never.word, never.condition))
        return
    pending = next((c for c in conditions if c.state == PENDING), None)
    reason = (
        RELEASED
        if pending is None
        else waiting_reason(pending.kind, pending.parent_id, pending.condition)
    )
    fields = {"reason": reason[:300], "held_by_dependencies": pending is not None}
    if (job.reason, job.held_by_dependencies) == (fields["reason"], fields["held_by_dependencies"]):
        return
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


# --- arrays as dependents --------------------------------------------------------------------------


def _settle_array_fields(array: JobArray, conditions: list[Condition]) -> str:
    """The array's own state from its conditions on whole parents: "failed", "held" or "free"."""
    never = next((c for c in conditions if c.state == NEVER), None)
    if never is not None:
        array.failed_reason = failed_reason(
            never.kind, never.parent_id, never.word, never.condition
        )
        array.held_by_dependencies = False
        JobArray.objects.filter(pk=array.pk).update(
            failed_reason=array.failed_reason, held_by_dependencies=False
        )
        return "failed"
    held = any(c.state == PENDING for c in conditions)
    if held != array.held_by_dependencies:
        JobArray.objects.filter(pk=array.pk).update(held_by_dependencies=held)
        array.held_by_dependencies = held
    return "held" if held else "free"


def array_waiting_reason(array: JobArray) -> str:
    """What a task of a held array waits for: its first pending condition on a whole parent."""
    row = (
        JobDependency.objects.filter(array=array, state=PENDING)
        .exclude(condition=AFTERCORR)
        .order_by("position")
        .first()
    )
    if row is None:
        return RELEASED
    kind = "job" if row.parent_job_id is not None else "array"
    return waiting_reason(kind, row.parent_job_id or row.parent_array_id, row.condition)


def task_conditions(array: JobArray, indices: list[int]) -> dict[int, list[Condition]]:
    """{index: its conditions} for tasks of `array`: the array's own, aftercorr's read from the
    parent's task of the same index (a row, or the parent's virtual state)."""
    rows = list(JobDependency.objects.filter(array=array).order_by("position"))
    whole = _conditions([r for r in rows if r.condition != AFTERCORR])
    corr = [r for r in rows if r.condition == AFTERCORR]
    states: dict = {}
    parents: dict = {}
    if corr:
        parents = {
            a.pk: a for a in JobArray.objects.filter(pk__in=[r.parent_array_id for r in corr])
        }
        ids = [array_tasks.task_id(r.parent_array_id, i) for r in corr for i in indices]
        states = dict(Job.objects.filter(pk__in=ids).values_list("pk", "state"))
    out: dict[int, list[Condition]] = {}
    for index in indices:
        conditions = list(whole)
        for row in corr:
            parent_task = array_tasks.task_id(row.parent_array_id, index)
            parent = parents.get(row.parent_array_id)
            state = states.get(parent_task) or (array_tasks.virtual_state(parent) if parent else "")
            conditions.append(
                Condition("job", parent_task, AFTERCORR, verdict(AFTERCORR, state), state)
            )
        out[index] = conditions
    return out


def _index(task: Job) -> int:
    assert task.array_index is not None  # a task of an array
    return task.array_index


def tasks_made(array: JobArray, jobs: list[Job]) -> None:
    """Tasks of an array with dependencies just became rows, held: settle each (released in one
    statement where nothing holds them)."""
    by_index = task_conditions(array, [_index(job) for job in jobs])
    free = []
    for job in jobs:
        conditions = by_index[_index(job)]
        if all(c.state == SATISFIED for c in conditions):
            free.append(job.pk)
            job.held_by_dependencies, job.reason = False, RELEASED
        else:
            _settle(job, conditions)
    if free and Job.objects.filter(pk__in=free, state=JobState.QUEUED).update(
        held_by_dependencies=False, reason=RELEASED
    ):
        trigger_dispatch()


def settle_array(array: JobArray) -> None:
    """One of the array's conditions on a whole parent was decided: fail it whole, keep it held,
    or free it (its held rows are settled task by task, aftercorr may hold them still). The
    array is locked before its conditions are read, as `settle_jobs` locks its jobs."""
    _lock(JobArray.objects.filter(pk=array.pk))
    array.refresh_from_db()
    if array.failed_reason or array.ended_at is not None:
        return
    rows = (
        JobDependency.objects.filter(array=array).exclude(condition=AFTERCORR).order_by("position")
    )
    outcome = _settle_array_fields(array, _conditions(list(rows)))
    waiting = list(
        Job.objects.filter(array=array, state=JobState.QUEUED, held_by_dependencies=True)
    )
    if outcome == "failed":
        for job in waiting:
            _fail(job, array.failed_reason)
        array_tasks.check_ended(array.pk)  # the tasks without a row have failed with it
        return
    if waiting:
        tasks_made(array, waiting)
    if outcome == "free":
        trigger_dispatch()  # the dispatcher makes its tasks into rows again


# --- a parent ended ------------------------------------------------------------------------------

_local = threading.local()


def on_job_ended(event: events.JobEnded) -> None:
    """In-transaction handler of JobEnded (subscribed in apps/jobs/apps.py). A dependent failed
    here ends through `transition_job` and so emits JobEnded in turn: those ends are queued and
    settled by the outermost call, one after another, so a long chain fails in one go without
    growing the stack."""
    _drain(("job", event.job))


def on_array_ended(event: events.ArrayEnded) -> None:
    """In-transaction handler of ArrayEnded: the conditions on the whole array are decided."""
    _drain(("array", event.array_id))


def _drain(item) -> None:
    queue = getattr(_local, "queue", None)
    if queue is not None:
        queue.append(item)
        return
    _local.queue = queue = deque([item])
    try:
        _decide_queued(queue)
    finally:
        _local.queue = None


@contextmanager
def decided_together(*, unawaited: Collection = ()) -> Iterator[None]:
    """Within the block (in the caller's transaction), the ends of parents are queued and decided
    when it ends, those of consecutive jobs with one read for all of them: a batch of agent
    reports ending many jobs, almost none of them anyone's parent (apps/jobs/batch_reports.py).
    `unawaited`: the ids of jobs that no pending dependency waits on, as read after their row
    locks in this transaction (apps/jobs/services.py `ReportedMember.awaited`): none can be added
    before it ends (a submit locks a parent before writing a dependency on it, and a requeue,
    which reopens them, moves the parent's row), so their ends read nothing for their own
    dependents (a task's array's still are). If the block raises, nothing is decided (its
    transaction or savepoint is rolled back)."""
    if getattr(_local, "queue", None) is not None:  # inside a drain already: it decides them
        yield
        return
    _local.queue = queue = deque[tuple[str, object]]()
    try:
        yield
        _decide_queued(queue, frozenset(unawaited))
    finally:
        _local.queue = None


def _decide_queued(queue: deque, unawaited: frozenset = frozenset()) -> None:
    while queue:
        kind, what = queue.popleft()
        if kind != "job":
            array_ended(what)
            continue
        parents = [what]
        while queue and queue[0][0] == "job":
            parents.append(queue.popleft()[1])
        parents_ended(parents, unawaited=unawaited)


def parents_ended(parents: list[Job], *, unawaited: frozenset = frozenset()) -> None:
    """parent_ended for each of `parents`, in order; for more than one, one read of the
    (parent, state) index first, and only the parents it finds waited for (or tasks of an
    array, whose array's dependents may be decided) are looked at one by one. The jobs in
    `unawaited` (`decided_together`) are known to be waited for by none: not read."""
    parents = [p for p in parents if p.pk not in unawaited or p.array_id is not None]
    if len(parents) > 1:
        waited = set(
            JobDependency.objects.filter(
                parent_job_id__in=[p.pk for p in parents if p.pk not in unawaited], state=PENDING
            )
            .order_by()
            .values_list("parent_job_id", flat=True)
        )
        parents = [p for p in parents if p.pk in waited or p.array_id is not None]
    for parent in parents:
        parent_ended(parent, awaited=parent.pk not in unawaited)


def parent_ended(parent: Job, *, awaited: bool = True) -> int:
    """Decide the pending dependencies on `parent` (ended), and for a task of an array those on
    its array that its end decides; settle their dependents. One read of the (parent, state)
    index finds none for almost every job; none where `awaited` is False (no pending
    dependency waits on it: `decided_together`). Returns the dependencies decided."""
    decided = 0
    if awaited:
        decided = _decide(JobDependency.objects.filter(parent_job_id=parent.pk, state=PENDING),
                          lambda condition: verdict(condition, parent.state))  # fmt: skip
    if parent.array_id is not None:
        decided += _task_of_parent_array_ended(parent)
    return decided


def _task_of_parent_array_ended(task: Job) -> int:
    pending = JobDependency.objects.filter(parent_array_id=task.array_id, state=PENDING)
    rows = list(pending.order_by().values_list("pk", "job_id", "array_id", "condition"))
    if not rows:
        return 0
    # Task i of an aftercorr parent: task i of each dependent array, if it is a row already
    # (one made later reads the parent's task as it is made).
    corr = {array_id for _, _, array_id, condition in rows if condition == AFTERCORR}
    if corr:
        # Locked as settle_array locks them: a dependent array's condition on a whole parent,
        # decided at once in another transaction, is then read decided here (or waits for it).
        _lock(JobArray.objects.filter(pk__in=corr))
        ids = [array_tasks.task_id(array_id, _index(task)) for array_id in corr]
        for dependent in Job.objects.filter(
            pk__in=ids, state=JobState.QUEUED, held_by_dependencies=True
        ):
            array = dependent.array
            assert array is not None  # a task of the dependent array
            index = _index(dependent)
            _settle(dependent, task_conditions(array, [index])[index])
    # On the whole array: one task that did not succeed decides afterok and afternotok now;
    # the array's end (ArrayEnded) decides the rest.
    if task.state in NOT_OK:
        early = {DependencyCondition.AFTEROK: NEVER, DependencyCondition.AFTERNOTOK: SATISFIED}
        return _decide(
            pending.filter(condition__in=list(early)), lambda condition: early[condition]
        )
    return 0


def array_ended(array_id) -> int:
    array = JobArray.objects.filter(pk=array_id).first()
    if array is None:
        return 0
    pending = JobDependency.objects.filter(parent_array_id=array_id, state=PENDING).exclude(
        condition=AFTERCORR
    )
    return _decide(pending, lambda condition: array_verdict(condition, array)[0])


def _decide(pending, decide) -> int:
    """Mark each of `pending` as `decide(condition)` says, then settle the dependents of those
    decided (jobs: failed, held, or released in one statement; arrays: `settle_array`)."""
    # .order_by(): Meta's ordering (by the dependent job) joined the jobs table for nothing.
    rows = list(pending.order_by().values_list("pk", "job_id", "array_id", "condition"))
    if not rows:
        return 0
    now = timezone.now()
    by_state: dict[str, list] = {}
    jobs, arrays = set(), set()
    for pk, job_id, array_id, condition in rows:
        state = decide(condition)
        if state == PENDING:
            continue
        by_state.setdefault(state, []).append(pk)
        (jobs.add(job_id) if job_id is not None else arrays.add(array_id))
    for state, pks in by_state.items():
        JobDependency.objects.filter(pk__in=pks).update(state=state, decided_at=now)
    if jobs:
        settle_jobs(jobs)
    for array in JobArray.objects.filter(pk__in=arrays):
        settle_array(array)
    return sum(len(pks) for pks in by_state.values())


def settle_jobs(job_ids: set) -> None:
    """Settle the queued, held jobs among `job_ids` from their dependencies as stored: those
    now free are released in one statement, the others fail or name their next wait.

    The dependents are locked before their dependencies are read: two parents of one job ending
    at once in two transactions (two agents' reports) each decided their own condition and
    read the other's as still pending, so neither released the job, which then waited for ever.
    Locked, the second waits for the first's commit and reads both decided (PostgreSQL reads
    each statement's data afresh; SQLite runs one writer at a time)."""
    _lock(Job.objects.filter(pk__in=job_ids))
    open_rows: dict = {}
    for row in (
        JobDependency.objects.filter(job_id__in=job_ids)
        .exclude(state=SATISFIED)
        .order_by("job_id", "position")
    ):
        open_rows.setdefault(row.job_id, []).append(row)
    free = [pk for pk in job_ids if pk not in open_rows]
    if free and Job.objects.filter(pk__in=free, state=JobState.QUEUED, held_by_dependencies=True).update(
        held_by_dependencies=False, reason=RELEASED
    ):  # fmt: skip
        trigger_dispatch()
    if not open_rows:
        return
    for job in Job.objects.filter(
        pk__in=list(open_rows), state=JobState.QUEUED, held_by_dependencies=True
    ):
        _settle(job, _conditions(open_rows[job.pk]))


# --- a parent requeued -------------------------------------------------------------------------


def on_job_requeued(event: events.JobRequeued) -> None:
    """In-transaction handler of JobRequeued (subscribed in apps/jobs/apps.py)."""
    parent_requeued(event.job)


def parent_requeued(parent: Job) -> int:
    """`parent` ended and is queued again: the decided conditions on it (and, for a task, those
    on its array that no longer hold) go back to pending where their dependent has not been
    placed yet, and those dependents are held again. Returns the conditions reopened."""
    rows = list(JobDependency.objects.filter(parent_job_id=parent.pk).exclude(state=PENDING))
    if parent.array_id is not None:
        rows += _undecided_on_array(parent.array_id)
        _hold_corresponding_tasks(parent)
    jobs = _not_placed(Job.objects.filter(pk__in={r.job_id for r in rows if r.job_id}))
    not_ended = JobArray.objects.filter(ended_at=None, cancelled_at=None, failed_reason="")
    arrays = list(not_ended.filter(pk__in={r.array_id for r in rows if r.array_id}))
    job_ids, array_ids = {job.pk for job in jobs}, {array.pk for array in arrays}
    reopened = [r.pk for r in rows if r.job_id in job_ids or r.array_id in array_ids]
    JobDependency.objects.filter(pk__in=reopened).update(state=PENDING, decided_at=None)
    for job in jobs:
        _hold_again(Job.objects.filter(pk=job.pk), _first_waiting_reason(job))
    for array in arrays:
        JobArray.objects.filter(pk=array.pk).update(held_by_dependencies=True)
        _hold_again(Job.objects.filter(array=array), array_waiting_reason(array))
    return len(reopened)


def _undecided_on_array(array_id) -> list[JobDependency]:
    """The decided conditions on a whole array that its counts, with a task queued again, no
    longer decide (afterany: not all ended; afternotok: no task failed any more...)."""
    array = JobArray.objects.get(pk=array_id)
    rows = JobDependency.objects.filter(parent_array_id=array_id).exclude(condition=AFTERCORR)
    return [
        row
        for row in rows.exclude(state=PENDING)
        if array_verdict(row.condition, array)[0] == PENDING
    ]


def _hold_corresponding_tasks(task: Job) -> None:
    """aftercorr: task i of each dependent array, a row not placed yet, waits for task i again."""
    rows = JobDependency.objects.filter(parent_array_id=task.array_id, condition=AFTERCORR)
    arrays = rows.values_list("array_id", flat=True)
    ids = [array_tasks.task_id(array_id, _index(task)) for array_id in arrays]
    if ids:
        _hold_again(Job.objects.filter(pk__in=ids), waiting_reason("job", task.pk, AFTERCORR))


def _locked(rows):
    """`rows` read with the lock a row's update takes (FOR NO KEY UPDATE), where the database
    has row locks (SQLite runs one writer at a time)."""
    if connection.features.has_select_for_update:
        return rows.select_for_update(no_key=True)
    return rows


def _lock(rows) -> None:
    """Lock `rows` (in id order) until the transaction ends."""
    list(_locked(rows).order_by("pk").values_list("pk", flat=True))


def _not_placed(jobs):
    """Those of `jobs` still queued and never placed, locked against the dispatcher's placing
    them meanwhile (PostgreSQL: the lock its guarded update takes)."""
    return list(_locked(jobs.filter(state=JobState.QUEUED, attempts_count=0)))


def _hold_again(jobs, reason: str) -> None:
    """Hold those of `jobs` not placed yet. The version moves, so a dispatcher pass that read
    one released before this commits cannot place it (its compare-and-swap fails)."""
    jobs.filter(state=JobState.QUEUED, attempts_count=0).update(
        held_by_dependencies=True, reason=reason[:300], version=F("version") + 1
    )


def _first_waiting_reason(job: Job) -> str:
    row = JobDependency.objects.filter(job=job, state=PENDING).order_by("position").first()
    assert row is not None  # one was just reopened
    kind = "job" if row.parent_job_id is not None else "array"
    return waiting_reason(kind, row.parent_job_id or row.parent_array_id, row.condition)


# --- reading -----------------------------------------------------------------------------------


def _shown(row: JobDependency) -> dict:
    kind = "job" if row.parent_job_id is not None else "array"
    parent = row.parent_job_id if kind == "job" else row.parent_array_id
    return {kind: str(parent), "condition": row.condition, "state": row.state}


def depends_on(job: Job) -> list[dict]:
    """The job's `depends_on` as submitted, each with its state (pending, satisfied, never); a
    task's are its array's (aftercorr's state: that of the parent's task of its index)."""
    rows = getattr(job, "depends_on_rows", None)  # set by `attach` on the job it made
    if rows is None:
        if not job.has_dependencies:
            return []
        if job.array is not None and job.array_index is not None:
            return task_depends_on(job.array, job.array_index)
        rows = job.dependencies.all()  # prefetched by the jobs list
    return [_shown(r) for r in rows]


def task_depends_on(array: JobArray, index: int) -> list[dict]:
    """A task's `depends_on`: its array's, aftercorr's state read from the parent's task of its
    index. The array's rows and its aftercorr parents are read once per array instance (a
    listing page shares one): a task then costs no statement, or one with aftercorr."""
    cached = getattr(array, "_dependency_rows", None)
    if cached is None:
        rows = list(JobDependency.objects.filter(array=array).order_by("position"))
        parent_ids = [r.parent_array_id for r in rows if r.condition == AFTERCORR]
        parents = (
            {a.pk: a for a in JobArray.objects.filter(pk__in=parent_ids)} if parent_ids else {}
        )
        cached = array._dependency_rows = (rows, parents)  # type: ignore[attr-defined]
    rows, parents = cached
    corr = {
        r.pk: array_tasks.task_id(r.parent_array_id, index)
        for r in rows
        if r.condition == AFTERCORR
    }
    states = (
        dict(Job.objects.filter(pk__in=list(corr.values())).values_list("pk", "state"))
        if corr
        else {}
    )
    shown = []
    for row in rows:
        entry = _shown(row)
        if row.pk in corr:
            parent = parents.get(row.parent_array_id) if row.parent_array_id else None
            state = states.get(corr[row.pk]) or (
                array_tasks.virtual_state(parent) if parent else ""
            )
            entry["state"] = verdict(AFTERCORR, state)
        shown.append(entry)
    return shown


# --- artifacts for pipelines -----------------------------------------------------------------------


def parent_jobs(job: Job) -> list:
    """The ids of the jobs whose artifacts are the job's inputs, in the order its dependencies
    name them (each once): a parent job; every task of a parent array that has a row (in index
    order); for aftercorr, the parent's task of the job's own index."""
    if job.array_id is not None and job.array_index is not None and job.has_dependencies:
        rows = JobDependency.objects.filter(array_id=job.array_id)
    else:
        rows = JobDependency.objects.filter(job=job)
    seen: dict = {}
    for parent_job, parent_array, condition in rows.order_by("position").values_list(
        "parent_job_id", "parent_array_id", "condition"
    ):
        if parent_job is not None:
            seen.setdefault(parent_job, None)
        elif condition == AFTERCORR:
            seen.setdefault(array_tasks.task_id(parent_array, job.array_index), None)
        else:
            for task in (
                Job.objects.filter(array_id=parent_array)
                .order_by("array_index")
                .values_list("pk", flat=True)
            ):
                seen.setdefault(task, None)
    return list(seen)


def input_artifacts(job: Job) -> list:
    """The artifacts of the job's parents (the same tenant's jobs, by construction), parent by
    parent in `parent_jobs`' order, then by name: what the job reads as its inputs."""
    order = {parent_id: i for i, parent_id in enumerate(parent_jobs(job))}
    if not order:
        return []
    found = Artifact.objects.filter(job_id__in=list(order)).select_related("job")
    return sorted(found, key=lambda a: (order[a.job_id], a.name))


def input_artifact(job: Job, parent_id, name: str):
    """One artifact of one of the job's parents, or None (not a parent, or no such artifact)."""
    if parent_id not in set(parent_jobs(job)):
        return None
    return Artifact.objects.filter(job_id=parent_id, name=name).first()
