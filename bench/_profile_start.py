"""Profile the dispatcher's pass that places a single new job on an idle cluster (issue 35's
start latency): `dispatch_once` under cProfile, one job submitted, placed, started and ended per
round, the pass after its end run unprofiled (as on a platform, where the end asks for a pass).

    python -m bench._profile_start [--rounds 40] [--top 30] [--sort cumulative]

4 nodes x 4 GPUs, one-GPU `true` jobs, through the services (no web, no agents). A fresh SQLite
file (or a fresh PostgreSQL database beside DATABASE_URL's) and an embedded Redis. Prints the
submit pass's CPU and wall time (median) and, with `--top`, cProfile's rows. Not part of `make
bench` (a tool for finding the cost, not a figure).
"""

from __future__ import annotations

import argparse
import cProfile
import logging
import pstats
import statistics
import sys
import time

from bench._in_process import django_in_process, peer_cluster


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=40)
    parser.add_argument("--top", type=int, default=30)
    parser.add_argument("--sort", default="cumulative")
    args = parser.parse_args()
    with django_in_process():
        logging.disable(logging.INFO)
        rounds(args)
    return 0


def rounds(args) -> None:
    from apps.admission import enqueue
    from apps.jobs import services
    from apps.jobs.models import JobAttempt
    from apps.scheduling.dispatcher import dispatch_once

    member, spec = peer_cluster()
    dispatch_once()  # warm: imports, the kept cluster, the first plan
    profile = cProfile.Profile()
    cpus, walls = [], []
    for _ in range(args.rounds):
        enqueue.job_submit(tenant=member.tenant, user=member.user, spec=spec)
        cpu, wall = time.process_time(), time.perf_counter()
        if args.top:
            profile.enable()
        result = dispatch_once()
        profile.disable()
        cpus.append(time.process_time() - cpu)
        walls.append(time.perf_counter() - wall)
        assert len(result.placed) == 1, result
        attempt = JobAttempt.objects.get(job_id=result.placed[0])
        token = str(attempt.token)
        services.attempt_member_started(attempt_id=attempt.pk, rank=0, token=token, pid=1)
        services.attempt_member_finished(attempt_id=attempt.pk, rank=0, token=token, exit_code=0)
        dispatch_once()  # the end's pass: places nothing
    print(f"{args.rounds} submit passes: {statistics.median(cpus) * 1000:.2f} ms CPU, "
          f"{statistics.median(walls) * 1000:.2f} ms wall (medians)"
          f"{' (profiled)' if args.top else ''}")  # fmt: skip
    if args.top:
        pstats.Stats(profile).sort_stats(args.sort).print_stats(args.top)


if __name__ == "__main__":
    sys.exit(main())
