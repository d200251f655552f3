"""Job arrays as the API sees them (docs/arrays.md): each task, with a row or without one yet.

A JobArray's tasks at positions below `materialised` are Job rows (apps/admission/arrays.py
makes them as the dispatcher needs them); the others are *virtual*: queued (or cancelled, once
the array is), with the id their row will take, uuid5(array id, str(index)). Counting and
listing read the rows and add the virtual tasks, so a client sees every task as if it existed.
Cancel and requeue-failed are here too: they change tasks the way a job's cancel and requeue do.
"""

from __future__ import annotations

import hashlib
import uuid
from dataclasses import dataclass
from functools import partial

from django.db import transaction
from django.db.models import Count, F, Q
from django.utils import timezone

from apps.jobs.arrayspec import ArraySpec, parse
from apps.jobs.models import JOB_ACTIVE, JOB_TERMINAL, Job, JobArray, JobEvent, JobState
from apps.jobs.services import job_cancel, job_requeue, trigger_dispatch
from apps.platform import events
from apps.platform.errors import ServiceError
from apps.platform.retry import retried

UNLIMITED = 10**9  # parse() of a stored spec: it was checked against the cap when it came in
ENDED_KIND = "array"  # JobEvent.kind of the array's end (the webhooks' array.ended)


def task_id(array_id, index: int) -> uuid.UUID:
    """A task's id, before and after it has a row: the row is inserted with it."""
    namespace = array_id if isinstance(array_id, uuid.UUID) else uuid.UUID(str(array_id))
    return uuid.uuid5(namespace, str(index))


def task_id_text(namespace: bytes, index: int) -> str:
    """str(task_id(array, index)) from the array id's bytes, without building UUID objects (a
    listing page makes a thousand): uuid5 is SHA-1 of namespace + name with the version and
    variant bits set (RFC 4122 4.3); tests/unit/test_arrayspec.py holds the two equal."""
    digest = bytearray(hashlib.sha1(namespace + str(index).encode()).digest()[:16])
    digest[6] = (digest[6] & 0x0F) | 0x50
    digest[8] = (digest[8] & 0x3F) | 0x80
    h = digest.hex()
    return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"


def spec_of(array: JobArray) -> ArraySpec:
    return parse(array.spec, max_tasks=UNLIMITED)


def anchor(array: JobArray):
    """The submit time a task's `created_at` counts from (+ its position in microseconds): its
    first task's, made with the array (kept on the instance)."""
    found = getattr(array, "_anchor", None)
    if found is None:
        first = parse(array.spec, max_tasks=UNLIMITED).index_at(0)
        found = (
            Job.objects.filter(array=array, array_index=first)
            .values_list("created_at", flat=True)
            .first()
        ) or array.created_at
        array._anchor = found  # type: ignore[attr-defined]
    return found


def virtual_state(array: JobArray) -> str:
    if array.failed_reason:  # a dependency of the array can never hold (docs/pipelines.md)
        return JobState.FAILED
    return JobState.CANCELLED if array.cancelled_at else JobState.QUEUED


def counts(array: JobArray) -> dict[str, int]:
    """Tasks by state, every state present (0 when none), the virtual ones included."""
    found = dict(
        Job.objects.filter(array=array).values_list("state").annotate(n=Count("pk")).order_by()
    )
    result = {state: int(found.get(state, 0)) for state in JobState.values}
    result[virtual_state(array)] += array.size - array.materialised
    return result


def progress(array: JobArray, by_state: dict[str, int]) -> float:
    """The share of tasks that have ended (0..1)."""
    return sum(by_state[s] for s in JOB_TERMINAL) / array.size if array.size else 1.0


@dataclass(frozen=True)
class VirtualTask:
    """A task with no row yet, shaped like the job it will be (the listing's fields)."""

    array: JobArray
    position: int
    index: int

    @property
    def pk(self) -> uuid.UUID:
        return task_id(self.array.pk, self.index)


def tasks(array: JobArray, *, state: str | None, offset: int, limit: int) -> tuple[int, list]:
    """(how many tasks match, the page): Job rows and VirtualTasks in index order, from
    `offset`. Rows first (positions below `materialised`), then the virtual ones: a page costs
    one count and one indexed read of the rows it shows, whatever the array's size."""
    rows = Job.objects.filter(array=array)
    virtual = array.size - array.materialised
    if state is not None:
        rows = rows.filter(state=state)
        if state != virtual_state(array):
            virtual = 0
    materialised = rows.count()
    total = materialised + virtual
    page: list = []
    if offset < materialised:
        page = list(rows.order_by("array_index")[offset : offset + limit])
    start = max(0, offset - materialised)
    wanted = limit - len(page)
    if wanted > 0 and start < virtual:
        spec = spec_of(array)
        for position in range(
            array.materialised + start, min(array.size, array.materialised + start + wanted)
        ):
            page.append(VirtualTask(array=array, position=position, index=spec.index_at(position)))  # fmt: skip
    return total, page


# --- cancel and requeue-failed -------------------------------------------------------------------


def array_cancel(*, array: JobArray, actor: str, reason: str = "array cancelled by user") -> int:
    """Every task ends cancelled: the virtual ones at once (the array's `cancelled_at`: no row is
    ever made for them), each materialised active one through job_cancel, which tells a running
    attempt to stop; its GPUs are released when the agent reports the process tree gone, as for
    a job's cancel. Returns the number of tasks cancelled. A second cancel is a 400 naming `state`, as a job's."""
    with transaction.atomic():
        locked = JobArray.objects.select_for_update().get(pk=array.pk)
        if locked.cancelled_at is not None:
            raise ServiceError("array is already cancelled", field="state")
        now = timezone.now()
        JobArray.objects.filter(pk=array.pk).update(cancelled_at=now)
        array.cancelled_at = locked.cancelled_at = now
        array.materialised = locked.materialised
    cancelled = array.size - array.materialised
    for job in Job.objects.filter(array=array, state__in=JOB_ACTIVE).order_by("array_index"):
        try:
            job_cancel(job=job, actor=actor, reason=reason)
            cancelled += 1
        except ServiceError:
            continue  # it ended meanwhile
    # In a transaction of its own: the end decides the array's dependents, which locks them
    # (outside one, that lock was a TransactionManagementError: a 500 for the cancel).
    check_ended_in_transaction(array.pk)
    trigger_dispatch()
    return cancelled


def requeue_failed(*, array: JobArray, actor: str) -> int:
    """Failed tasks go back to the queue with a new attempt to come (job_requeue); the number
    requeued. The array's end is to come again (`ended_at` cleared)."""
    if array.cancelled_at is not None:
        raise ServiceError("array is cancelled: its tasks cannot be requeued", field="state")
    requeued = 0
    for job in Job.objects.filter(array=array, state=JobState.FAILED).order_by("array_index"):
        try:
            job_requeue(job=job, actor=actor, reason="requeued with the array's failed tasks")
            requeued += 1
        except ServiceError:
            continue
    if requeued:
        array.ended_at = None  # in the database: on_job_requeued, for each task
    return requeued


def on_job_requeued(event: events.JobRequeued) -> None:
    """In-transaction handler of JobRequeued: a task of an ended array is back in the queue (its
    requeue-failed, or staff's requeue of one task), so the array's end is to come again."""
    if event.job.array_id is not None:
        JobArray.objects.filter(pk=event.job.array_id).exclude(ended_at=None).update(ended_at=None)


# --- the array's end, once -----------------------------------------------------------------------


def check_ended(array_id) -> bool:
    """When the array's last task has ended: mark it ended (a guarded update, so one caller
    wins) and record its `array` event on the task that ended last (its webhooks' array.ended,
    with the counts). True when this call was the one."""
    array = JobArray.objects.filter(pk=array_id, ended_at=None).first()
    if array is None:
        return False
    if array.materialised < array.size and array.cancelled_at is None and not array.failed_reason:
        return False  # virtual tasks still to run
    if Job.objects.filter(array=array, state__in=JOB_ACTIVE).exists():
        return False
    now = timezone.now()
    if not JobArray.objects.filter(pk=array_id, ended_at=None).update(ended_at=now):
        return False
    last = Job.objects.filter(array=array).order_by(F("finished_at").desc(nulls_last=True)).first()
    if last is not None:
        by_state = counts(array)
        JobEvent.objects.create(
            job=last, kind=ENDED_KIND, actor="system:arrays", reason="array ended",
            data={"array": str(array.pk), "counts": {s: by_state[s] for s in JOB_TERMINAL},
                  "size": array.size},
        )  # fmt: skip
    events.emit(events.ArrayEnded(array_id=array.pk))  # its dependents are decided (pipelines)
    return True


def on_job_ended(event) -> None:
    """In the ending task's transaction (JobEnded): its array may have ended with it. Two tasks
    ending at once in transactions of their own (two agents' reports) each see the other still
    active, and neither would end the array: so when this check finds the array not ended, it
    is made again once this transaction has committed, where the last of them to commit sees
    every end. `end_settled_arrays` (the reconcile tick) covers a process lost in between."""
    job = event.job
    if job.array_id is not None and not check_ended(job.array_id):
        # robust: the ending task has committed; a failure here is logged, and the tick repairs it
        transaction.on_commit(partial(check_ended_in_transaction, job.array_id), robust=True)


@retried
def check_ended_in_transaction(array_id) -> bool:
    """`check_ended` in a transaction of its own (run again whole after a deadlock): for a
    caller outside one, since the end decides the array's dependents under their locks."""
    with transaction.atomic():
        return check_ended(array_id)


def end_settled_arrays() -> int:
    """The reconcile tick's repair: arrays whose every task has ended (none left virtual) but
    whose end was never recorded get it now. Returns how many. Only arrays with no virtual task
    left are looked at, each with `check_ended`'s one indexed look for an active task (not one
    read of every active job, which a queue of 100,000 would make long)."""
    candidates = JobArray.objects.filter(ended_at=None).filter(
        Q(materialised__gte=F("size")) | ~Q(cancelled_at=None) | ~Q(failed_reason="")
    )
    ended = 0
    for array_id in candidates.values_list("pk", flat=True):
        ended += check_ended_in_transaction(array_id)
    return ended
