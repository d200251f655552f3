"""`python -m scripts.chaos_audit [--since EPOCH] [--kills EPOCH,...]`: what the database says
about a platform after a chaos run, as one line of JSON (run it with the platform's env).

Checks, each a count that must be 0: jobs whose attempts' processes ever overlapped in time,
GPUs whose allocations ever overlapped, GPUs still held by an ended attempt, processes of ended
attempts never reported gone, and job logs that show one member started twice.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import sys
from collections import Counter, defaultdict
from datetime import UTC, datetime

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "gpuplatform.settings")


def overlaps(intervals: list[tuple[float, float]]) -> int:
    """How many intervals start before the previous one (in start order) ended."""
    count, end = 0, None
    for start, stop in sorted(intervals):
        if end is not None and start < end:
            count += 1
        end = stop if end is None else max(end, stop)
    return count


def epoch(moment) -> float:
    return moment.timestamp() if moment else datetime.now(UTC).timestamp()


def audit(
    since: float = 0.0, kills: list[float] | None = None, data_dir: pathlib.Path | None = None
) -> dict:
    from apps.jobs.models import ATTEMPT_TERMINAL, AttemptMember, GpuAllocation, Job, JobAttempt

    after = datetime.fromtimestamp(since, tz=UTC)
    jobs = Job.objects.filter(created_at__gte=after)
    attempts = JobAttempt.objects.filter(job__in=jobs)
    # A job's processes: each member from its start to its report of being gone.
    runs: dict[str, list[tuple[float, float, int]]] = defaultdict(list)
    for job_id, number, started, ended in AttemptMember.objects.filter(
        attempt__in=attempts, started_at__isnull=False
    ).values_list("attempt__job_id", "attempt__number", "started_at", "ended_at"):
        runs[str(job_id)].append((epoch(started), epoch(ended), number))
    jobs_run_twice = sum(1 for spans in runs.values() if _attempts_overlap(spans))
    # Live attempts per job: the database's own view (placed until ended).
    lives: dict[str, list[tuple[float, float]]] = defaultdict(list)
    for job_id, created, ended in attempts.values_list("job_id", "created_at", "ended_at"):
        lives[str(job_id)].append((epoch(created), epoch(ended)))
    by_gpu: dict[int, list[tuple[float, float]]] = defaultdict(list)
    for gpu, allocated, released in GpuAllocation.objects.values_list(
        "gpu_id", "allocated_at", "released_at"
    ):
        by_gpu[gpu].append((epoch(allocated), epoch(released)))
    starts = sorted(epoch(t) for t in attempts.values_list("created_at", flat=True))
    return {
        "jobs": jobs.count(),
        "jobs_by_state": dict(Counter(jobs.values_list("state", flat=True))),
        "jobs_by_tier": dict(Counter(jobs.values_list("tier__name", flat=True))),
        "gangs": jobs.filter(nodes__gt=1).count(),
        "attempts": attempts.count(),
        "attempts_by_state": dict(Counter(attempts.values_list("state", flat=True))),
        "most_attempts_of_a_job": max(
            Counter(attempts.values_list("job_id", flat=True)).values(), default=0
        ),
        "allocations": GpuAllocation.objects.filter(attempt__in=attempts).count(),
        "jobs_with_two_attempts_running_at_once": jobs_run_twice,
        "jobs_with_two_live_attempts": sum(1 for spans in lives.values() if overlaps(spans)),
        "gpu_double_placements": sum(overlaps(spans) for spans in by_gpu.values()),
        "gpus_held_by_ended_attempts": GpuAllocation.objects.filter(
            released_at=None, attempt__state__in=ATTEMPT_TERMINAL
        ).count(),
        "gpus_held": GpuAllocation.objects.filter(released_at=None).count(),
        "open_members_of_ended_attempts": AttemptMember.objects.filter(
            ended_at=None, attempt__state__in=ATTEMPT_TERMINAL
        ).count(),
        "members_started_twice": _logs_started_twice(data_dir) if data_dir else None,
        "takeover_seconds": [
            round(_next_after(starts, kill) - kill, 2)
            for kill in kills or []
            if _next_after(starts, kill)
        ],
    }


def _attempts_overlap(spans: list[tuple[float, float, int]]) -> bool:
    """Two different attempts of one job had a process up at the same moment."""
    for i, (start, stop, number) in enumerate(spans):
        for other_start, other_stop, other in spans[i + 1 :]:
            if other != number and start < other_stop and other_start < stop:
                return True
    return False


def _next_after(starts: list[float], moment: float) -> float | None:
    return next((s for s in starts if s > moment), None)


def _logs_started_twice(data_dir: pathlib.Path) -> int:
    """demo-train prints its gang env once per process: a log with two such lines ran twice."""
    twice = 0
    # Written by the agents (each in its own data dir, as on its own machine), not the job.
    for log in data_dir.glob("agents/*/logs/*/attempt-*.log"):
        if log.read_text(errors="replace").count("demo-train: RANK=") > 1:
            twice += 1
    return twice


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m scripts.chaos_audit")
    parser.add_argument(
        "--since", type=float, default=0.0, help="only jobs submitted after this epoch time"
    )
    parser.add_argument(
        "--kills", default="", help="epoch times a dispatcher was killed (comma-separated)"
    )
    args = parser.parse_args(argv)
    import django

    django.setup()
    from django.conf import settings

    kills = [float(k) for k in args.kills.split(",") if k]
    print(json.dumps(audit(args.since, kills, pathlib.Path(settings.DATA_DIR))))
    return 0


if __name__ == "__main__":
    sys.exit(main())
