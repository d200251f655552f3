"""Job arrays in (a submit with `array`) and their tasks into the queue, lazily (docs/arrays.md).

Submit: one JobArray row under the lock of the tenant's count row, whatever the array's size
(on PostgreSQL, without a key or dependencies, in one round trip: rows.admit_array; every task
virtual until the dispatcher's next pass), or with its first task's row (`_admit`: an
Idempotency-Key's record and the dependencies' links name that task); the queued-job cap
counts the whole array (refused whole, 429 with Retry-After, when its tasks would take the
tenant past the cap) and the rate limit took one token for the request
(apps/admission/services.py), as for one job.

Materialise: once per dispatcher pass (`materialise`, the first step of
apps/scheduling/dispatcher.py's `dispatch_once`), each open array gets as many queued task rows
as could start now (the free GPUs over the task's, and the room its `%N` leaves), and at least
ARRAY_QUEUED_TASKS queued, so that the policy sees the array's demand (fair share, preemption)
when nothing is free. The rest stay virtual: counted and listed as queued (apps/jobs/arrays.py),
no row. Tasks are made in index order, each with the id uuid5(array id, index) and the array's
submit time plus its position in microseconds as `created_at` (its place in the queue is the
array's: it was submitted then).
"""

from __future__ import annotations

import logging
from datetime import timedelta

from django.conf import settings
from django.db import IntegrityError, connection, transaction
from django.db.models import Case, Count, F, Value, When

from apps.admission import dispatch, idempotency, quotas, rows
from apps.admission.writer import end_turn_at_commit, write_turn
from apps.jobs import arrays as tasks_of
from apps.jobs import dependencies
from apps.jobs.arrayspec import ArraySpec, task_params
from apps.jobs.models import JOB_PLACED, GpuAllocation, Job, JobArray, JobEvent, JobState
from apps.jobs.services import SPEC_FIELDS, JobSpec, check_allowed, queue_full
from apps.nodes.models import Gpu, GpuHealth, NodeState
from apps.platform.retry import retried
from apps.tenants.models import Tenant

log = logging.getLogger(__name__)
MATERIALISE_BATCH = 1000  # task rows one array gets in one pass at most
CPU_TASKS_A_PASS = 64  # CPU-only tasks (gpus 0): the free GPUs say nothing of what could start


# --- submit --------------------------------------------------------------------------------------


def task_fields(spec: JobSpec) -> dict:
    """The JobSpec as JSON (JobArray.task): relations by id."""
    out = {}
    for name in SPEC_FIELDS:
        value = getattr(spec, name)
        if name in ("tier", "template", "gpu_sku"):
            out[f"{name}_id"] = value.pk if value is not None else None
        else:
            out[name] = value
    return out


def submit_array(*, tenant: Tenant, user, spec: JobSpec, array: ArraySpec, params: list, grid: dict,
                 limits: dict, key: str | None, digest: str,
                 depends_on: list | None = None) -> tuple[JobArray, Job, bool]:  # fmt: skip
    """The array, its first task and True; or the array and first task an earlier request with
    this Idempotency-Key made, and False."""
    if key is None and not depends_on and _in_one_statement():
        made = _admit_in_one_statement(tenant=tenant, user=user, spec=spec, array=array,
                                       params=params, grid=grid, limits=limits)  # fmt: skip
        if made is not None:
            return (*made, True)
    try:
        with write_turn() as turn:  # SQLite: submissions queue for its one write lock
            return _admit(tenant=tenant, user=user, spec=spec, array=array, params=params, grid=grid,
                          limits=limits, key=key, digest=digest, turn=turn, depends_on=depends_on or [])  # fmt: skip
    except IntegrityError:
        earlier = idempotency.replay(tenant=tenant, key=key, digest=digest)
        if earlier is None or earlier.array is None:
            raise
        return earlier.array, earlier, False


def _in_one_statement() -> bool:
    return connection.vendor == "postgresql" and not connection.in_atomic_block


def _admit_in_one_statement(*, tenant, user, spec, array, params, grid,
                            limits) -> tuple[JobArray, Job] | None:  # fmt: skip
    """The usual array on PostgreSQL (no Idempotency-Key, no dependencies) in one round trip,
    committed on its own (rows.admit_array): the tenant's count row locked, then the cap's check
    on its queue and the array's row alone. Every task is virtual (`materialised` 0): the
    dispatcher's next pass, which the submit asks for, makes the first rows before it orders the
    queue (`materialise`), so no task starts later for it. One row of 23 values instead of three
    of 72 (psycopg caches the binding of a statement of up to 50): ~1.4 ms less a submit
    (docs/bench/50-arrays.md). `_admit`'s transaction takes four round trips (BEGIN, the locks
    and counts, the inserts, COMMIT) and makes the first task's row there (an Idempotency-Key's
    record and the dependencies' links name it). Returns the array and its first task, unsaved
    (the row it will be: `first_task`). None: nothing written, the tenant has no count row yet
    (no job ever queued), and `_admit` takes it from here."""
    check_allowed(tenant, spec)
    quotas.check_gpu_hours(tenant=tenant, limits=limits, gpus_wanted=spec.gpus * spec.nodes)
    job_array = array_row(tenant=tenant, user=user, spec=spec, array=array, params=params,
                          grid=grid, materialised=0)  # fmt: skip
    admitted = rows.admit_array(job_array, cap=limits["max_queued_jobs"])
    if admitted is None:
        return None
    queued, saved = admitted
    if saved is None:
        raise too_big(tenant, array, queued, limits)
    dispatch.request_soon()
    return saved, first_task(saved, array)


@retried
@transaction.atomic
def _admit(*, tenant, user, spec, array, params, grid, limits, key, digest, turn,
           depends_on=()) -> tuple[JobArray, Job, bool]:  # fmt: skip
    end_turn_at_commit(turn)
    check_allowed(tenant, spec)
    if key is not None and connection.features.has_select_for_update:
        rows.lock_tenant(tenant)  # the key's check below must see a concurrent replay's row
    earlier = idempotency.replay(tenant=tenant, key=key, digest=digest)
    if earlier is not None and earlier.array is not None:
        return earlier.array, earlier, False
    # The parents (404 for another tenant's), locked in a job's submit's order (docs/pipelines.md):
    # the tenant, the parents, then the queued count's row.
    if depends_on and key is None and connection.features.has_select_for_update:
        rows.lock_tenant(tenant)
    parents = dependencies.resolve(tenant, depends_on, array=array) if depends_on else []
    quotas.check_gpu_hours(tenant=tenant, limits=limits, gpus_wanted=spec.gpus * spec.nodes)
    # The tenant's lock and its count row's (PostgreSQL; SQLite's write lock is held already),
    # then its queue: kept count and arrays' virtual tasks (rows.queued_for_cap, one round trip).
    queued = rows.queued_for_cap(tenant, lock_tenant=True)
    if queued + array.size > limits["max_queued_jobs"]:
        raise too_big(tenant, array, queued, limits)
    job_array, job, event = new_array(tenant=tenant, user=user, spec=spec, array=array,
                                      params=params, grid=grid, held=bool(parents))  # fmt: skip
    job_array, first = rows.insert_array_job_and_event(job_array, job, event)
    if parents:
        dependencies.attach_array(job_array, parents)
        dependencies.tasks_made(job_array, [first])  # released, failed, or waiting
    idempotency.remember(tenant=tenant, key=key, digest=digest, job=first)
    dispatch.after_commit()
    return job_array, first, True


def too_big(tenant: Tenant, array: ArraySpec, queued: int, limits: dict):
    """The queued-job cap's 429 for an array refused whole (`queued`: the tenant's queue now)."""
    cap = limits["max_queued_jobs"]
    error = queue_full(tenant, queued, limits)
    error.message = (
        f"an array of {array.size} tasks would take tenant {tenant.slug} to {queued + array.size} "
        f"queued jobs, over its cap of {cap} ({queued} queued now): refused whole"
    )
    return error


def array_row(*, tenant: Tenant, user, spec: JobSpec, array: ArraySpec, params: list, grid: dict,
              materialised: int) -> JobArray:  # fmt: skip
    """The new array's row (not yet saved)."""
    return JobArray(
        tenant=tenant, user=user, tier=spec.tier, name=spec.name, spec=array.spec, size=array.size,
        throttle=array.throttle, params=params, grid=grid, task=task_fields(spec),
        materialised=materialised,
    )  # fmt: skip


def new_array(*, tenant: Tenant, user, spec: JobSpec, array: ArraySpec, params: list, grid: dict,
              held: bool = False) -> tuple[JobArray, Job, JobEvent]:  # fmt: skip
    """The new array (not yet saved, `materialised` 1) with its task at position 0 and that
    task's event. `held`: it has dependencies, its tasks are made held (docs/pipelines.md). The
    task's `created_at` is its insert's: the other tasks' are counted from it (`anchor`)."""
    job_array = array_row(tenant=tenant, user=user, spec=spec, array=array, params=params,
                          grid=grid, materialised=1)  # fmt: skip
    job_array.has_dependencies = held
    job = first_task(job_array, array)
    job.has_dependencies = job.held_by_dependencies = held
    event = JobEvent(job=job, actor=f"user:{user.username}", to_state=JobState.QUEUED,
                     reason=f"submitted (task {job.array_index} of array {job_array.pk})")  # fmt: skip
    return job_array, job, event


def first_task(job_array: JobArray, array: ArraySpec) -> Job:
    """The array's task at position 0 as its row will be (not saved here)."""
    fields = dict(job_array.task)
    base = fields.pop("params", {}) or {}
    index = array.index_at(0)
    return Job(
        id=tasks_of.task_id(job_array.pk, index), tenant_id=job_array.tenant_id,
        user_id=job_array.user_id, array=job_array, array_index=index,
        reason="waiting for the dispatcher",
        params=task_params(base, job_array.params, job_array.grid, 0), **fields,
    )  # fmt: skip


# --- tasks into rows -----------------------------------------------------------------------------


def make_tasks(array: JobArray, count: int) -> list[Job]:
    """Rows for the next `count` virtual tasks (in the caller's transaction, the array's row
    locked or just made): queued, each with its audit event; moves `materialised` on."""
    start = array.materialised
    stop = min(array.size, start + count)
    if stop <= start:
        return []
    spec = tasks_of.spec_of(array)
    fields = dict(array.task)
    base = fields.pop("params", {}) or {}
    user_name = array.user.username
    jobs, events = [], []
    for position in range(start, stop):
        index = spec.index_at(position)
        job = Job(
            id=tasks_of.task_id(array.pk, index), tenant_id=array.tenant_id, user_id=array.user_id,
            array=array, array_index=index, reason="waiting for the dispatcher",
            params=task_params(base, array.params, array.grid, position), **fields,
        )  # fmt: skip
        jobs.append(job)
        events.append(JobEvent(job=job, actor=f"user:{user_name}", to_state=JobState.QUEUED,
                               reason=f"submitted (task {index} of array {array.pk})"))  # fmt: skip
    if array.has_dependencies:  # made held: their conditions are settled below
        for job in jobs:
            job.has_dependencies = job.held_by_dependencies = True
    # Each task's place in the queue is its array's submit (its first task's time, or the
    # array's where this makes the first, + its position in microseconds), not the moment its row
    # was made. Read before the insert, which would otherwise be the first task it finds.
    anchor = tasks_of.anchor(array)
    Job.objects.bulk_create(jobs)
    at = {job.pk: anchor + timedelta(microseconds=p) for p, job in enumerate(jobs, start)}
    Job.objects.filter(pk__in=list(at)).update(
        created_at=Case(*(When(pk=pk, then=Value(t)) for pk, t in at.items()))
    )
    for job in jobs:
        job.created_at = at[job.pk]
    JobEvent.objects.bulk_create(events)
    JobArray.objects.filter(pk=array.pk).update(materialised=stop)
    array.materialised = stop
    if array.has_dependencies:
        dependencies.tasks_made(array, jobs)  # released, failed, or waiting (docs/pipelines.md)
    return jobs


def free_gpus() -> int:
    """Healthy GPUs on ready nodes not held by an attempt."""
    usable = Gpu.objects.filter(node__state=NodeState.READY, health=GpuHealth.HEALTHY).count()
    held = GpuAllocation.objects.filter(
        released_at=None, gpu__node__state=NodeState.READY, gpu__health=GpuHealth.HEALTHY
    ).count()
    return max(0, usable - held)


def materialise() -> int:
    """Once per dispatcher pass: queued rows for the open arrays' tasks (see the module's
    docstring), and the end of any array whose last task's end was missed (two tasks ending at
    once on PostgreSQL each see the other still running). The number of rows made."""
    if not _any_array_open():
        return 0
    open_arrays = list(
        JobArray.objects.filter(ended_at=None)
        .filter(cancelled_at=None, materialised__lt=F("size"))
        .filter(held_by_dependencies=False, failed_reason="")  # held or failed: no rows to make
    )
    for array in JobArray.objects.filter(ended_at=None).exclude(
        cancelled_at=None, failed_reason="", materialised__lt=F("size")
    ):
        tasks_of.check_ended_in_transaction(array.pk)
    if not open_arrays:
        return 0
    free = free_gpus()
    by_state: dict = {}
    for array_id, state, n in (
        Job.objects.filter(array__in=open_arrays, state__in=(JobState.QUEUED, *JOB_PLACED))
        .values_list("array_id", "state")
        .annotate(n=Count("pk"))
        .order_by()
    ):
        by_state.setdefault(array_id, {})[state] = n
    made = 0
    for array in open_arrays:
        states = by_state.get(array.pk, {})
        queued = states.get(JobState.QUEUED, 0)
        placed = sum(states.get(s, 0) for s in JOB_PLACED)
        per_task = max(1, int(array.task.get("gpus", 1)) * int(array.task.get("nodes", 1)))
        could_start = free // per_task if array.task.get("gpus", 1) else CPU_TASKS_A_PASS
        want = max(could_start, settings.ARRAY_QUEUED_TASKS)
        if array.throttle is not None:
            want = min(want, array.throttle - placed)
        count = min(MATERIALISE_BATCH, want - queued)
        if count > 0:
            made += _materialise(array.pk, count)
    return made


def _any_array_open() -> bool:
    """Whether an array has not ended: most passes find none (the two reads below, built by the
    ORM every pass, were a twentieth of a drain's pass), so a probe written once says so."""
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT 1 FROM {JobArray._meta.db_table} WHERE ended_at IS NULL LIMIT 1")
        return cursor.fetchone() is not None


@retried
@transaction.atomic
def _materialise(array_id, count: int) -> int:
    # The array's row alone (`of`): with its user's row too, every submit of that user waited
    # at its commit (the foreign-key check on the job's user) for this, which waited for the
    # submit's count row.
    array = (
        JobArray.objects.select_for_update(of=("self",)).select_related("user")
        .filter(pk=array_id).first()
    )  # fmt: skip
    if (
        array is None
        or array.cancelled_at is not None
        or array.held_by_dependencies
        or array.failed_reason
    ):
        return 0
    return len(make_tasks(array, count))
