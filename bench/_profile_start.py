"""Profile the dispatcher's pass that places a single new job on an idle cluster (issue 35's
start latency): `dispatch_once` under cProfile, one job submitted, placed, started and ended per
round, the pass after its end run unprofiled (as on a platform, where the end asks for a pass).

    python -m bench._profile_start [--rounds 40] [--top 30] [--sort cumulative] [--statements]

4 nodes x 4 GPUs, one-GPU `true` jobs, through the services (no web, no agents). A fresh SQLite
file (or a fresh PostgreSQL database beside DATABASE_URL's) and an embedded Redis. Prints the
submit pass's CPU and wall time (median), its statements (each a round trip to the database: on
PostgreSQL a wait for the server's process as well) and the wall time spent in them; with
`--statements` each statement's median time and its first words; with `--top`, cProfile's
rows. Not part of `make bench` (a tool for finding the cost, not a figure). The transaction's
BEGIN and COMMIT are round trips too, but no statements Django's execute wrapper sees.
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
    parser.add_argument("--statements", action="store_true")
    args = parser.parse_args()
    with django_in_process():
        logging.disable(logging.INFO)
        rounds(args)
    return 0


def rounds(args) -> None:
    from django.db import connection

    from apps.admission import enqueue
    from apps.jobs import services
    from apps.jobs.models import JobAttempt
    from apps.scheduling.dispatcher import dispatch_once

    member, spec = peer_cluster()
    dispatch_once()  # warm: imports, the kept cluster, the first plan
    profile = cProfile.Profile()
    cpus, walls, counts, in_statements = [], [], [], []
    statements: dict[int, tuple[str, list[float]]] = {}
    for _ in range(args.rounds):
        enqueue.job_submit(tenant=member.tenant, user=member.user, spec=spec)
        timed: list[tuple[str, float]] = []

        def timing(execute, sql, params, many, context, timed=timed):
            started = time.perf_counter()
            try:
                return execute(sql, params, many, context)
            finally:
                timed.append((sql, time.perf_counter() - started))

        cpu, wall = time.process_time(), time.perf_counter()
        if args.top:
            profile.enable()
        with connection.execute_wrapper(timing):
            result = dispatch_once()
        profile.disable()
        cpus.append(time.process_time() - cpu)
        walls.append(time.perf_counter() - wall)
        counts.append(len(timed))
        in_statements.append(sum(seconds for _, seconds in timed))
        for i, (sql, seconds) in enumerate(timed):
            statements.setdefault(i, (sql, []))[1].append(seconds)
        assert len(result.placed) == 1, result
        attempt = JobAttempt.objects.get(job_id=result.placed[0])
        token = str(attempt.token)
        services.attempt_member_started(attempt_id=attempt.pk, rank=0, token=token, pid=1)
        services.attempt_member_finished(attempt_id=attempt.pk, rank=0, token=token, exit_code=0)
        dispatch_once()  # the end's pass: places nothing
    print(f"{args.rounds} submit passes: {statistics.median(cpus) * 1000:.2f} ms CPU, "
          f"{statistics.median(walls) * 1000:.2f} ms wall (medians)"
          f"{' (profiled)' if args.top else ''}; {statistics.median(counts):.0f} statements, "
          f"{statistics.median(in_statements) * 1000:.2f} ms in them ({connection.vendor})")  # fmt: skip
    if args.statements:
        for sql, seconds in statements.values():
            print(f"  {statistics.median(seconds) * 1000:6.2f} ms  {' '.join(sql.split())[:100]}")
    if args.top:
        pstats.Stats(profile).sort_stats(args.sort).print_stats(args.top)


if __name__ == "__main__":
    sys.exit(main())
