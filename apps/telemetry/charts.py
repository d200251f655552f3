"""SVG charts of a job's GPUs for its page (templates/web/_gpu_charts.html): one per GPU,
utilisation (left axis, %) and memory used (right axis, MiB) over time (UTC clock labels).
Coordinates are computed here, drawn with SVG attributes only (the CSP forbids inline style);
static/js/gpu_charts.js redraws them the same way as samples arrive on the job's stream."""

from __future__ import annotations

import datetime as dt
import math
from collections import defaultdict

from django.db.models import Q
from django.utils import timezone

from apps.admission.quotas import period_bounds
from apps.jobs.models import ATTEMPT_ACTIVE, JOB_PLACED, GpuAllocation, Job, JobEvent
from apps.platform.names import GPU_IDLE_KIND
from apps.telemetry.models import GpuPoint
from apps.telemetry.read import job_metrics, utilization_usage

WIDTH, HEIGHT = 600, 180
LEFT, RIGHT, TOP, BOTTOM = 44, 64, 10, 24  # room for the axes' labels
PLOT_W, PLOT_H = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM


def nice_ceiling(value: float) -> int:
    """The memory axis' top: 1, 2 or 5 times a power of ten, at least `value` (and 1)."""
    if value <= 1:
        return 1
    power = 10 ** math.floor(math.log10(value))
    for step in (1, 2, 5, 10):
        if step * power >= value:
            return int(step * power)
    return int(10 * power)


def _clock(t: float) -> str:
    return dt.datetime.fromtimestamp(t, tz=dt.UTC).strftime("%H:%M:%S")


def chart(points: list[tuple[float, float, int]], *, memory_total: int = 0) -> dict:
    """One GPU's chart from its (t, util, memory_mib) points, in time order."""
    t0, t1 = points[0][0], points[-1][0]
    span = max(t1 - t0, 1.0)
    top = nice_ceiling(max(max(p[2] for p in points), 1))

    def x(t: float) -> float:
        return LEFT + (t - t0) / span * PLOT_W

    def line(values: list[float], most: float) -> str:
        return " ".join(f"{x(t):.1f},{TOP + PLOT_H - v / most * PLOT_H:.1f}"
                        for t, v in zip((p[0] for p in points), values, strict=True))  # fmt: skip

    ticks_y = [{"y": TOP + PLOT_H - f * PLOT_H, "util": int(100 * f), "memory": int(top * f)}
               for f in (0, 0.5, 1)]  # fmt: skip
    ticks_x = [{"x": x(t0 + f * span), "label": _clock(t0 + f * span),
                "anchor": ("start", "middle", "end")[i]} for i, f in enumerate((0, 0.5, 1))]  # fmt: skip
    return {
        "util": line([p[1] for p in points], 100), "memory": line([float(p[2]) for p in points], top),
        "memory_top": top, "ticks_y": ticks_y, "ticks_x": ticks_x, "t0": t0, "t1": t1,
        "last_util": points[-1][1], "last_memory": points[-1][2], "memory_total": memory_total,
    }  # fmt: skip


def idle_warning(job: Job) -> str:
    """The reason of the job's last `gpu.idle` event while it runs: the page's banner."""
    if job.state not in JOB_PLACED:
        return ""
    event = JobEvent.objects.filter(job=job, kind=GPU_IDLE_KIND).order_by("-pk").first()
    active = job.attempts.filter(state__in=ATTEMPT_ACTIVE).order_by("-number").first()
    if event is None or active is None or event.attempt_id != active.pk:
        return ""
    return event.reason


def job_charts(job: Job) -> dict:
    """What the job page's GPU card shows: its summary and a chart per GPU (none: no samples)."""
    body = job_metrics(job)
    by_gpu: dict[tuple[str, int], list] = defaultdict(list)
    for s in body["samples"]:
        t = dt.datetime.fromisoformat(s["t"]).timestamp()
        by_gpu[(s["node"], s["index"])].append((t, s["util"], s["memory_mib"]))
    charts = []
    for gpu in body["gpus"]:
        points = by_gpu.get((gpu["node"], gpu["index"]))
        if points:
            charts.append({**gpu, **chart(points)})
    return {"summary": body["summary"], "charts": charts, "idle": idle_warning(job), "geometry": {
        "width": WIDTH, "height": HEIGHT, "left": LEFT, "right": WIDTH - RIGHT, "top": TOP,
        "bottom": TOP + PLOT_H}}  # fmt: skip


# --- the usage page: allocated beside used ----------------------------------------------------

BAR_W, BAR_H, BAR_LEFT, BAR_TOP, BAR_BOTTOM = 700, 210, 64, 22, 24


def _day_spans(hours: dict, begin: dt.datetime, end: dt.datetime) -> None:
    """Add [begin, end) to the per-UTC-day totals (hours), split at midnights."""
    while begin < end:
        midnight = dt.datetime.combine(
            begin.date() + dt.timedelta(days=1), dt.time(), tzinfo=dt.UTC
        )
        stop = min(end, midnight)
        if begin.date() in hours:
            hours[begin.date()] += (stop - begin).total_seconds() / 3600
        begin = stop


def efficiency_by_day(tenant, *, days: int = 14, now: dt.datetime | None = None) -> dict:
    """GPU-hours allocated and used (weighted by utilisation) per UTC day over the last `days`,
    as an SVG bar chart's geometry (two bars a day, a y-axis in GPU-hours, one label a day), and
    the period's figures per user (apps/telemetry/read.py)."""
    now = (now or timezone.now()).astimezone(dt.UTC)
    first = (now - dt.timedelta(days=days - 1)).date()
    start = dt.datetime.combine(first, dt.time(), tzinfo=dt.UTC)
    allocated = {first + dt.timedelta(days=i): 0.0 for i in range(days)}
    used = dict.fromkeys(allocated, 0.0)
    held = GpuAllocation.objects.filter(attempt__job__tenant=tenant, allocated_at__lt=now).filter(
        Q(released_at=None) | Q(released_at__gt=start)
    )
    for allocated_at, released_at in held.values_list("allocated_at", "released_at")[:50_000]:
        _day_spans(allocated, max(allocated_at, start), min(released_at or now, now))
    points = GpuPoint.objects.filter(series__job__tenant=tenant, t__gte=start.timestamp())
    for t, util, seconds in points.values_list("t", "util", "seconds").iterator():
        day = dt.datetime.fromtimestamp(t, tz=dt.UTC).date()
        if day in used:
            used[day] += util / 100 * seconds / 3600
    top = max(max(allocated.values()), max(used.values()))
    top = nice_ceiling(top) if top >= 1 else (_fine_ceiling(top) if top > 0 else 1)
    plot_w, plot_h = BAR_W - BAR_LEFT - 8, BAR_H - BAR_BOTTOM - BAR_TOP
    slot = plot_w / days
    bars = []
    for i, day in enumerate(allocated):
        x = BAR_LEFT + i * slot
        a, u = allocated[day], used[day]
        bars.append({
            "day": day, "allocated": round(a, 3), "used": round(u, 3),
            "x_alloc": round(x + slot * 0.1, 1), "x_used": round(x + slot * 0.5, 1),
            "w": round(slot * 0.4, 1), "label_x": round(x + slot / 2, 1),
            "h_alloc": round(a / top * plot_h, 1), "y_alloc": round(BAR_TOP + plot_h - a / top * plot_h, 1),
            "h_used": round(u / top * plot_h, 1), "y_used": round(BAR_TOP + plot_h - u / top * plot_h, 1),
        })  # fmt: skip
    ticks = [
        {"y": round(BAR_TOP + plot_h - f * plot_h, 1), "label": _hours(top * f)}
        for f in (0, 0.5, 1)
    ]
    return {"bars": bars, "ticks": ticks, "width": BAR_W, "height": BAR_H, "left": BAR_LEFT,
            "top": BAR_TOP, "bottom": BAR_TOP + plot_h, "right": BAR_W - 8,
            "period": utilization_usage(tenant, period_bounds(now)[0], now)}  # fmt: skip


def _fine_ceiling(value: float) -> float:
    """nice_ceiling below 1 GPU-hour: 0.01, 0.02, 0.05, 0.1, ..."""
    power = 10 ** math.floor(math.log10(value))
    return next(step * power for step in (1, 2, 5, 10) if step * power >= value)


def _hours(value: float) -> str:
    """A y-axis label in GPU-hours, short enough for the chart's left margin."""
    return f"{value:.3g} h"
