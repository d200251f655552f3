"""SVG charts of a job's GPUs for its page (templates/web/_gpu_charts.html): one per GPU,
utilisation (left axis, %) and memory used (right axis, MiB) over time (UTC clock labels).
Coordinates are computed here, drawn with SVG attributes only (the CSP forbids inline style);
static/js/gpu_charts.js redraws them the same way as samples arrive on the job's stream."""

from __future__ import annotations

import datetime as dt
import math
from collections import defaultdict

from apps.jobs.models import Job
from apps.telemetry.read import job_metrics

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
    return {"summary": body["summary"], "charts": charts, "geometry": {
        "width": WIDTH, "height": HEIGHT, "left": LEFT, "right": WIDTH - RIGHT, "top": TOP,
        "bottom": TOP + PLOT_H}}  # fmt: skip
