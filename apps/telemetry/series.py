"""A bounded series of GPU samples (pure Python): points `[t, util, memory_mib, seconds]`.

Samples are appended as points, one each (a heartbeat writes only its new samples). When a
series passes MAX_POINTS it is compacted: merged into buckets as wide as its span over
KEEP_POINTS (never narrower than its last merge), so it holds about KEEP_POINTS again and the
next MAX_POINTS - KEEP_POINTS samples append as they come. A series therefore never holds more
than MAX_POINTS, its older points are coarser than its newest, and a longer job's buckets are
wider. One compaction per MAX_POINTS - KEEP_POINTS samples rewrites the series: a few row
writes a sample over time."""

from __future__ import annotations

MAX_POINTS = 1000
KEEP_POINTS = 500  # what a series is merged down to once it passes MAX_POINTS


def merge(a: list, b: list) -> list:
    """Two points as one: the first's start, utilisation weighted by seconds, memory's max."""
    seconds = a[3] + b[3]
    util = (a[1] * a[3] + b[1] * b[3]) / seconds if seconds > 0 else (a[1] + b[1]) / 2
    return [a[0], round(util, 2), max(a[2], b[2]), round(seconds, 3)]


def compact(points: list[list], bucket: float) -> tuple[list[list], float]:
    """`points` (in time order) merged to fit KEEP_POINTS buckets, and the bucket width."""
    span = points[-1][0] - points[0][0]
    bucket = max(bucket, span / KEEP_POINTS, 1e-3)
    return rebucket(points, bucket), bucket


def add(points: list[list], bucket: float, new: list[list]) -> tuple[list[list], float]:
    """`points` with the `new` ones (in time order, newer than the last) appended, compacted
    when they pass MAX_POINTS; and the bucket width now. What the database does (ingest)."""
    points = points + new
    if len(points) > MAX_POINTS:
        points, bucket = compact(points, bucket)
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
