"""Read-only queries behind the customer pages: free GPUs per SKU, a job's log tail, a tenant's
use against its caps and its GPU hours per day."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from datetime import date, datetime, timedelta

from django.core.files.storage import default_storage
from django.db.models import Count, DurationField, ExpressionWrapper, F, Max, Min, Sum, Value
from django.db.models.functions import Coalesce
from django.utils import timezone

from apps.jobs.models import GpuAllocation, Job
from apps.jobs.services import tenant_limits
from apps.jobs.usage import current_use
from apps.nodes.models import Gpu, GpuHealth, GpuSku, NodeState
from apps.tenants.models import Tenant

LOG_TAIL_BYTES = 8_000


@dataclass(frozen=True)
class SkuCapacity:
    sku: str
    total: int
    free: int


def capacity_by_sku() -> list[SkuCapacity]:
    """Healthy GPUs on nodes taking new work, and how many of them no attempt holds now."""
    usable = {"node__state": NodeState.READY, "health": GpuHealth.HEALTHY}
    total = dict(
        Gpu.objects.filter(**usable).values_list("node__sku__name").annotate(n=Count("pk"))
    )
    held = dict(
        GpuAllocation.objects.filter(
            released_at=None, **{f"gpu__{k}": v for k, v in usable.items()}
        )
        .values_list("gpu__node__sku__name")
        .annotate(n=Count("pk"))
    )
    names = GpuSku.objects.values_list("name", flat=True)
    return [
        SkuCapacity(sku=n, total=total.get(n, 0), free=total.get(n, 0) - held.get(n, 0))
        for n in names
    ]


def log_tail(job: Job, max_bytes: int = LOG_TAIL_BYTES) -> str:
    """The end of the latest attempt's log (whole lines only)."""
    if not job.attempts_count:
        return ""
    name = f"logs/{job.pk}/attempt-{job.attempts_count}.log"
    if not default_storage.exists(name):
        return ""
    size = default_storage.size(name)
    with default_storage.open(name, "rb") as handle:
        handle.seek(max(0, size - max_bytes))
        text = handle.read(max_bytes).decode("utf-8", errors="replace")
    if size > max_bytes and "\n" in text:
        text = text.split("\n", 1)[1]
    return text


@dataclass(frozen=True)
class CapUse:
    what: str
    used: int
    cap: int | None

    @property
    def percent(self) -> int:
        if not self.cap:
            return 0
        return min(100, round(100 * self.used / self.cap))


def tenant_use(tenant: Tenant) -> dict:
    """What the tenant uses now against its caps (the same figures as /api/v1/usage/)."""
    limits = tenant_limits(tenant)
    use = current_use(tenant)
    caps = [CapUse("queued jobs", use.queued_jobs, limits["max_queued_jobs"])]
    for sku in sorted(set(use.gpus_in_use) | set(limits["max_gpus"])):
        caps.append(
            CapUse(f"{sku} GPUs in use", use.gpus_in_use.get(sku, 0), limits["max_gpus"].get(sku))
        )
    return {
        "limits": limits,
        "caps": caps,
        "running_jobs": use.running_jobs,
        "queued_jobs": use.queued_jobs,
        "gpus_in_use": use.gpus_in_use,
    }


@dataclass(frozen=True)
class DayHours:
    day: date
    hours: float


def gpu_hours_by_day(
    tenant: Tenant, *, days: int = 14, now: datetime | None = None
) -> list[DayHours]:
    """GPU hours the tenant's attempts held, per UTC day, over the last `days` days."""
    now = now or timezone.now()
    first = (now - timedelta(days=days - 1)).date()
    start = datetime.combine(first, datetime.min.time(), tzinfo=now.tzinfo)
    hours = {first + timedelta(days=i): 0.0 for i in range(days)}
    held = GpuAllocation.objects.filter(attempt__job__tenant=tenant, allocated_at__lt=now).exclude(
        released_at__lt=start
    )
    for allocated_at, released_at in held.values_list("allocated_at", "released_at")[:50_000]:
        _spread(hours, max(allocated_at, start), released_at or now)
    return [DayHours(day, round(h, 3)) for day, h in hours.items()]


DAY_CHART = {"width": 560, "height": 190, "left": 46, "right": 8, "top": 16, "bottom": 34}
MIN_AXIS_HOURS = 1.0  # a few GPU-minutes stay a small bar, not a full-height one


def axis_top(busiest: float) -> float:
    """The y axis's top: the busiest day rounded up to 1, 2 or 5 times a power of ten, at least
    MIN_AXIS_HOURS."""
    top = max(busiest, MIN_AXIS_HOURS)
    power = 10 ** math.floor(math.log10(top))
    return next(step * power for step in (1, 2, 5, 10) if step * power >= top - 1e-9)


def day_chart(days: list[DayHours]) -> dict:
    """The usage page's bars per day as an SVG chart: a y axis in GPU hours with three ticks,
    one bar and one date label per day, all in the viewBox's units (no style, no script)."""
    c = DAY_CHART
    x0, x1 = c["left"], c["width"] - c["right"]
    y0, y1 = c["height"] - c["bottom"], c["top"]
    top = axis_top(max((d.hours for d in days), default=0.0))
    slot = (x1 - x0) / max(len(days), 1)
    bars = []
    for i, d in enumerate(days):
        height = d.hours / top * (y0 - y1)
        middle = x0 + (i + 0.5) * slot
        bars.append({
            "day": d.day, "hours": d.hours, "x": round(x0 + i * slot + slot * 0.15, 1),
            "width": round(slot * 0.7, 1), "y": round(y0 - height, 1), "height": round(height, 1),
            "middle": round(middle, 1), "value_y": round(y0 - height - 3, 1),
            "first_of_month": i == 0 or d.day.day == 1,
        })  # fmt: skip
    ticks = [{"y": round(y0 - f * (y0 - y1), 1), "label": f"{f * top:g}"} for f in (0, 0.5, 1)]
    return {**c, "x0": x0, "x1": x1, "y0": y0, "y1": y1, "bars": bars, "ticks": ticks,
            "label_x": x0 - 5, "day_y": y0 + 13, "month_y": y0 + 25, "top": top,
            "title_x": 10, "title_y": round((y0 + y1) / 2, 1)}  # fmt: skip


def _spread(hours: dict[date, float], begin: datetime, end: datetime) -> None:
    """Add the interval [begin, end) to the per-day totals, split at midnights."""
    while begin < end:
        midnight = datetime.combine(
            begin.date() + timedelta(days=1), datetime.min.time(), tzinfo=begin.tzinfo
        )
        stop = min(end, midnight)
        if begin.date() in hours:
            hours[begin.date()] += (stop - begin).total_seconds() / 3600
        begin = stop


EXIT_REASON = re.compile(r"exit code -?\d+")


def without_exit_code(reason: str) -> str:
    """A reason that only repeats the exit code shown beside the job's state reads as none."""
    return "" if EXIT_REASON.fullmatch(reason or "") else reason


def job_times(job: Job, now: datetime) -> dict:
    """How long the job waited for its first start and has run (elapsed while it runs)."""
    waited_until = job.started_at or (job.finished_at if job.finished_at else now)
    return {
        "waited": max(0.0, (waited_until - job.created_at).total_seconds()),
        "ran": running_time(job.started_at, job.finished_at, now),
        "running": job.finished_at is None and job.started_at is not None,
    }


CHART = {"width": 480, "height": 150, "left": 40, "right": 12, "top": 8, "bottom": 24}


def progress_chart(job, now: datetime | None = None) -> dict | None:
    """The job's progress over time as an SVG chart, from its 5% progress samples: the line's
    points, and the axes' ticks with their labels (0-100 % up, seconds since the start across),
    all in the viewBox's units, so the template draws it with no arithmetic and no style."""
    samples = list(
        job.events.filter(kind="progress").order_by("created_at").values_list("created_at", "data")
    )
    if not samples or job.started_at is None:
        return None
    start = job.started_at.timestamp()
    points = [(start, 0.0)] + [
        (at.timestamp(), float(data.get("progress", 0))) for at, data in samples
    ]
    if job.finished_at is not None:
        points.append((job.finished_at.timestamp(), job.progress))
    elif now is not None:  # while it runs, the line reaches now at the last progress seen
        points.append((max(now.timestamp(), points[-1][0]), points[-1][1]))
    span = max(points[-1][0] - start, 1e-6)
    c = CHART
    x0, x1 = c["left"], c["width"] - c["right"]
    y0, y1 = c["height"] - c["bottom"], c["top"]  # y0: the x axis (0 %), y1: 100 %

    def x(seconds: float) -> float:
        return x0 + seconds / span * (x1 - x0)

    def y(progress: float) -> float:
        return y0 - min(max(progress, 0.0), 1.0) * (y0 - y1)

    coords = " ".join(f"{x(t - start):.1f},{y(p):.1f}" for t, p in points)
    return {
        **c, "points": coords, "seconds": round(span), "x0": x0, "x1": x1, "y0": y0, "y1": y1,
        "label_x": x0 - 4, "label_y": y0 + 16,
        "y_ticks": [{"y": round(y(p), 1), "label": f"{round(p * 100)}%"} for p in (0, 0.5, 1)],
        "x_ticks": [{"x": round(x(f * span), 1), "label": _short(f * span),
                     "anchor": ("start", "middle", "end")[i]}
                    for i, f in enumerate((0, 0.5, 1))],
    }  # fmt: skip


def _short(seconds: float) -> str:
    """An axis label: 0 s, 1.5 s, 45 s, 2.5 min, 1.2 h."""
    if seconds < 10:
        return f"{seconds:.1f}".removesuffix(".0") + " s"
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 5400:
        return f"{seconds / 60:.1f} min".replace(".0 ", " ")
    return f"{seconds / 3600:.1f} h".replace(".0 ", " ")


# --- job arrays (docs/arrays.md) ------------------------------------------------------------------

BAR_ORDER = ("succeeded", "failed", "cancelled", "preempting", "running", "starting", "queued")
BAR_WIDTH = 1000


def state_bar(counts: dict[str, int], size: int) -> list[dict]:
    """An array's tasks by state as the segments of one bar (SVG rects: x and width of
    BAR_WIDTH, no inline style), ended states first."""
    segments, x = [], 0
    for state in BAR_ORDER:
        n = counts.get(state, 0)
        if not n or not size:
            continue
        width = round(n / size * BAR_WIDTH)
        segments.append({"state": state, "n": n, "x": x, "width": max(width, 1)})
        x += width
    return segments


def running_time(started_at: datetime | None, ended_at: datetime | None,
                 now: datetime) -> float | None:  # fmt: skip
    """Seconds from start to end (to now while it runs); None before it started."""
    if started_at is None:
        return None
    return max(0.0, ((ended_at or now) - started_at).total_seconds())


def _held(now: datetime):
    """An allocation's time held: to its release, or to now while held."""
    return ExpressionWrapper(
        Coalesce("released_at", Value(now)) - F("allocated_at"), output_field=DurationField()
    )


def gpu_hours_by(key: str, ids, now: datetime) -> dict:
    """GPU-hours held per `key` (an allocation's path to a job or an array id), summed by the
    database: one statement however many rows or attempts."""
    if not ids:
        return {}
    rows = (
        GpuAllocation.objects.filter(**{f"{key}__in": ids})
        .values_list(key)
        .annotate(held=Sum(_held(now)))
        .order_by()
    )
    return {k: held.total_seconds() / 3600 for k, held in rows if held is not None}


def add_row_times(jobs: list[Job], now: datetime | None = None) -> None:
    """Give each job of a list page `run_seconds` (its duration, or its elapsed time while it
    runs) and `gpu_hours`; an array's row gets them for the whole array (fold_arrays first)."""
    now = now or timezone.now()
    hours = gpu_hours_by("attempt__job_id", [j.pk for j in jobs if j.started_at], now)
    for job in jobs:
        job.run_seconds = running_time(job.started_at, job.finished_at, now)  # type: ignore[attr-defined]
        job.gpu_hours = hours.get(job.pk, 0.0)  # type: ignore[attr-defined]
    rows = [job.array_row for job in jobs if hasattr(job, "array_row")]
    if not rows:
        return
    ids = [row["array"].pk for row in rows]
    hours = gpu_hours_by("attempt__job__array_id", ids, now)
    spans = {
        a: (first, last)
        for a, first, last in Job.objects.filter(array_id__in=ids)
        .values_list("array_id")
        .annotate(first=Min("started_at"), last=Max("finished_at"))
        .order_by()
    }
    for row in rows:
        array = row["array"]
        first, last = spans.get(array.pk, (None, None))
        ended = array.ended_at or array.cancelled_at
        row["started_at"] = first
        row["run_seconds"] = running_time(first, (last or ended) if ended else None, now)
        row["gpu_hours"] = hours.get(array.pk, 0.0)


def array_row_state(array, counts: dict[str, int]) -> str:
    """An array as one word, as a job's state reads: active until it ends; then succeeded when
    every task succeeded, failed when one failed, else cancelled."""
    if array.cancelled_at:
        return "cancelled"
    if not array.ended_at:
        return "active"
    if counts.get("succeeded", 0) == array.size:
        return "succeeded"
    return "failed" if counts.get("failed", 0) else "cancelled"


def first_task_ids(arrays) -> list:
    """The id of each array's first task (made with the array): the row that stands for it in
    a jobs list."""
    from apps.jobs.arrays import spec_of, task_id

    return [task_id(array.pk, spec_of(array).index_at(0)) for array in arrays]


def fold_arrays(jobs: list[Job]) -> None:
    """Give each array's row in a jobs list (its first task) `array_row`: the array, its counts
    and its bar; two statements for the whole page."""
    from apps.jobs import arrays as tasks_of
    from apps.jobs.models import JobArray, JobState

    ids = {job.array_id for job in jobs if job.array_id is not None}
    if not ids:
        return
    found = {a.pk: a for a in JobArray.objects.filter(pk__in=ids).select_related("user")}
    rows: dict = {}
    for array_id, state, n in (
        Job.objects.filter(array_id__in=ids)
        .values_list("array_id", "state")
        .annotate(n=Count("pk"))
        .order_by()
    ):
        rows.setdefault(array_id, {})[state] = n
    for job in jobs:
        array = found.get(job.array_id) if job.array_id is not None else None
        if array is None:
            continue
        counts = {state: rows.get(array.pk, {}).get(state, 0) for state in JobState.values}
        counts[tasks_of.virtual_state(array)] += array.size - array.materialised
        job.array_row = {  # type: ignore[attr-defined]
            "array": array, "counts": counts, "bar": state_bar(counts, array.size),
            "done": sum(counts[s] for s in ("succeeded", "failed", "cancelled")),
            "state": array_row_state(array, counts),
        }  # fmt: skip
