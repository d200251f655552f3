"""A bounded series of GPU samples (pure Python): points `[t, util, memory_mib, seconds]`.

A sample becomes a point; a sample inside the last point's bucket merges into it (utilisation
weighted by the seconds each covers, the highest memory). Past MAX_POINTS the bucket width
doubles (at least to fit the series' span in KEEP_POINTS) and every point is merged again, so
a series never holds more than MAX_POINTS, and an older job's is coarser."""

from __future__ import annotations

MAX_POINTS = 1000
KEEP_POINTS = 500  # what a series is merged down to once it passes MAX_POINTS


def merge(a: list, b: list) -> list:
    """Two points as one: the first's start, utilisation weighted by seconds, memory's max."""
    seconds = a[3] + b[3]
    util = (a[1] * a[3] + b[1] * b[3]) / seconds if seconds > 0 else (a[1] + b[1]) / 2
    return [a[0], round(util, 2), max(a[2], b[2]), round(seconds, 3)]


def add(points: list[list], bucket: float, point: list) -> tuple[list[list], float]:
    """`points` with `point` added (in time order), and the bucket width now."""
    if points and point[0] < points[-1][0]:
        return points, bucket  # older than what the series holds: a resent sample
    if points and bucket > 0 and point[0] - points[-1][0] < bucket:
        points[-1] = merge(points[-1], point)
    else:
        points.append(point)
    if len(points) > MAX_POINTS:
        span = points[-1][0] - points[0][0]
        bucket = max(bucket * 2, span / KEEP_POINTS, 1e-3)
        points = rebucket(points, bucket)
    return points, bucket


def rebucket(points: list[list], bucket: float) -> list[list]:
    out: list[list] = []
    start = points[0][0]
    for point in points:
        if out and int((point[0] - start) / bucket) == int((out[-1][0] - start) / bucket):
            out[-1] = merge(out[-1], point)
        else:
            out.append(list(point))
    return out
