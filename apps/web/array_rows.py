"""The array page's task table: each task's own params (what sets it apart from the array's
others), how long it ran and how it ended, for rows and not-yet-rows (VirtualTask) alike."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from apps.jobs import arrays as array_tasks
from apps.jobs import dependencies
from apps.jobs.arrayspec import task_params
from apps.jobs.models import Job, JobArray, JobState
from apps.web.selectors import running_time, without_exit_code

NEVER_STARTED = "cancelled before it started"


@dataclass(frozen=True)
class TaskRow:
    index: int
    id: str
    job: Job | None  # None: no row yet (a VirtualTask)
    state: str
    progress: float
    params: dict
    run_seconds: float | None
    result: str


def varying(array: JobArray) -> set[str]:
    """The params that differ from task to task: those of `array_params` or `array_grid`."""
    if array.params:
        return {name for entry in array.params for name in entry}
    return set(array.grid or {})


def shared_params(array: JobArray) -> dict:
    """The params every task has alike, shown once above the table."""
    own = varying(array)
    return {k: v for k, v in (array.task.get("params") or {}).items() if k not in own}


QUEUED = "not yet a job: made when the dispatcher can start it"


def task_rows(array: JobArray, tasks: list, now: datetime) -> list[TaskRow]:
    own = varying(array)
    waits = QUEUED
    if array.held_by_dependencies and any(not isinstance(task, Job) for task in tasks):
        waits = dependencies.array_waiting_reason(array)  # once a page: one statement
    return [
        _row(task, own, now) if isinstance(task, Job) else _virtual(array, task, own, waits)
        for task in tasks
    ]


def _own(params: dict, own: set[str]) -> dict:
    return {k: v for k, v in params.items() if k in own}


def _row(job: Job, own: set[str], now: datetime) -> TaskRow:
    return TaskRow(
        index=job.array_index or 0, id=str(job.pk), job=job, state=job.state,
        progress=job.progress, params=_own(job.params or {}, own),
        run_seconds=running_time(job.started_at, job.finished_at, now), result=_result(job),
    )  # fmt: skip


def _result(job: Job) -> str:
    if job.state == JobState.CANCELLED and job.started_at is None:
        return NEVER_STARTED
    if job.exit_code is not None:
        reason = without_exit_code(job.reason)
        return f"exit code {job.exit_code}" + (f": {reason}" if reason else "")
    return job.reason


def _virtual(array: JobArray, task: array_tasks.VirtualTask, own: set[str], waits: str) -> TaskRow:
    state = array_tasks.virtual_state(array)
    if state == JobState.CANCELLED:
        result = NEVER_STARTED
    elif state == JobState.FAILED:
        result = array.failed_reason
    else:
        result = waits
    params = task_params({}, array.params, array.grid, task.position) if own else {}
    return TaskRow(index=task.index, id=str(task.pk), job=None, state=state, progress=0.0,
                   params=params, run_seconds=None, result=result)  # fmt: skip
