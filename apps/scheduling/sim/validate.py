"""Replay segments.csv and prove what the simulator claims about it.

`check(out_dir, gpus_per_node, nodes)` returns a list of problems (empty when all hold):
1. at no instant do the GPUs in use on a node exceed the node's GPUs, nor the cluster's total
   (segments ending at t free their GPUs before segments starting at t take them);
2. a gang's members start and stop together: each segment lists all its nodes on one row, and
   a job with `nodes` > 1 always has that many distinct nodes;
3. every job's segments add up to its duration plus its lost time (jobs.csv), within a relative
   1e-6 (float sums); only the last segment ends by `finish`, all earlier ones by `preempt`;
4. a job's segments do not overlap one another.
"""

from __future__ import annotations

import csv
from collections import defaultdict
from pathlib import Path


def check(out: Path, gpus_per_node: int, nodes: int) -> list[str]:
    jobs = _read(out / "jobs.csv")
    segments = _read(out / "segments.csv")
    problems: list[str] = []
    problems += _capacity(segments, gpus_per_node, nodes)
    by_job: dict[str, list[dict[str, str]]] = defaultdict(list)
    for seg in segments:
        by_job[seg["job_id"]].append(seg)
    for job in jobs:
        problems += _job(job, by_job.get(job["job_id"], []), gpus_per_node)
    return problems


def _read(path: Path) -> list[dict[str, str]]:
    with open(path, newline="") as fh:
        return list(csv.DictReader(fh))


def _capacity(segments: list[dict[str, str]], gpus_per_node: int, nodes: int) -> list[str]:
    changes: list[tuple[float, int, str, int]] = []  # (t, 0 = release first, node, gpus)
    for seg in segments:
        gpus = int(seg["gpus_per_node"])
        for node in seg["nodes"].split(";"):
            changes.append((float(seg["start"]), 1, node, gpus))
            changes.append((float(seg["end"]), 0, node, -gpus))
    changes.sort()
    used: dict[str, int] = defaultdict(int)
    total = 0
    problems = []
    for t, _, node, delta in changes:
        used[node] += delta
        total += delta
        if used[node] > gpus_per_node:
            problems.append(f"t={t}: node {node} has {used[node]} GPUs in use of {gpus_per_node}")
        if total > gpus_per_node * nodes:
            problems.append(f"t={t}: {total} GPUs in use of {gpus_per_node * nodes}")
        if len(problems) > 20:
            break
    return problems


def _job(job: dict[str, str], segments: list[dict[str, str]], gpus_per_node: int) -> list[str]:
    name = job["job_id"]
    if not job["end"]:
        return []  # never finished (the run ended first): nothing to add up
    if not segments:
        return [f"{name}: finished without a segment"]
    problems = []
    segments = sorted(segments, key=lambda s: float(s["start"]))
    gpus = int(job["gpus"])
    per_node = int(segments[0]["gpus_per_node"])
    width = gpus // per_node if per_node else 0
    run = 0.0
    previous_end = -float("inf")
    for i, seg in enumerate(segments):
        start, end = float(seg["start"]), float(seg["end"])
        members = seg["nodes"].split(";")
        if len(set(members)) != len(members) or len(members) != width:
            problems.append(
                f"{name}: segment at {start} on {seg['nodes']} is not a whole gang of {width}"
            )
        if start < previous_end - 1e-9:
            problems.append(f"{name}: segment at {start} overlaps the one before")
        last = i == len(segments) - 1
        if seg["ended_by"] != ("finish" if last else "preempt"):
            problems.append(f"{name}: segment {i} ended by {seg['ended_by']}")
        run += end - start
        previous_end = end
    lost_s = float(job["gpu_seconds_lost"]) / gpus if gpus else 0.0
    expected = float(job["duration"]) + lost_s
    if abs(run - expected) > 1e-6 * max(1.0, expected):
        problems.append(f"{name}: segments add up to {run}, duration + lost = {expected}")
    if int(job["preemptions"]) != len(segments) - 1:
        problems.append(f"{name}: {job['preemptions']} preemptions but {len(segments)} segments")
    return problems
