"""Profile the dispatcher's passes of a drain in one process: `dispatch_once` under cProfile,
the agents' reports made between passes by the report services (not profiled).

    python -m bench._profile_drain [--count 600] [--ends 4] [--top 40] [--sort tottime]

bench.slurm_peer's shapes: 4 nodes x 4 GPUs, `count` one-GPU `true` jobs queued through the
API; then passes until the queue is empty, each after `ends` of the running jobs have started and
ended (in a real drain a pass follows each batch of agents' reports: one to five jobs). A fresh
SQLite file (or a fresh PostgreSQL database beside DATABASE_URL's) and an embedded Redis.
Prints the dispatcher's CPU per pass and per placed job and cProfile's top rows (`--top 0`:
unprofiled). Not part of
`make bench` (a tool for finding the cost, not a figure).
"""

from __future__ import annotations

import argparse
import cProfile
import logging
import pstats
import sys
import time

from bench._in_process import django_in_process, peer_cluster


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--count", type=int, default=600)
    parser.add_argument("--ends", type=int, default=4)
    parser.add_argument("--top", type=int, default=40)
    parser.add_argument("--sort", default="tottime")
    parser.add_argument("--sql", action="store_true",
                        help="count the passes' statements (CaptureQueriesContext) by first words")  # fmt: skip
    args = parser.parse_args()
    with django_in_process():
        logging.disable(logging.INFO)  # a line per placed and ended job
        drain(args)
    return 0


def drain(args) -> None:
    from collections import Counter

    from django.core.management import call_command
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from apps.admission import enqueue
    from apps.jobs import services
    from apps.jobs.models import JobAttempt, JobState
    from apps.scheduling.dispatcher import dispatch_once

    call_command("set_quota", "acme", "--max-queued-jobs", "100000",
                 "--submit-rate", "1000000", "--submit-burst", "100000")  # fmt: skip
    member, spec = peer_cluster()
    for _ in range(args.count):
        enqueue.job_submit(tenant=member.tenant, user=member.user, spec=spec)
    dispatch_once()  # warm: imports, the kept cluster, the first plan
    placed, passes, cpu = 0, 0, 0.0
    profile = cProfile.Profile()
    running = list(JobAttempt.objects.filter(job__state=JobState.STARTING).order_by("pk"))
    began = time.perf_counter()
    statements: Counter = Counter()
    while running:
        for attempt in running[: args.ends]:
            token = str(attempt.token)
            services.attempt_member_started(attempt_id=attempt.pk, rank=0, token=token, pid=1)
            services.attempt_member_finished(attempt_id=attempt.pk, rank=0, token=token,
                                             exit_code=0)  # fmt: skip
        running = running[args.ends :]
        started = time.process_time()
        if args.top:
            profile.enable()
        if args.sql:
            with CaptureQueriesContext(connection) as captured:
                result = dispatch_once()
            statements.update(
                " ".join(q["sql"].split()[:4])[:70] for q in captured.captured_queries
            )
        else:
            result = dispatch_once()
        profile.disable()
        cpu += time.process_time() - started
        passes += 1
        placed += len(result.placed)
        running += list(JobAttempt.objects.filter(job_id__in=result.placed).order_by("pk"))
    print(f"{passes} passes placed {placed} jobs in {time.perf_counter() - began:.1f} s: "
          f"{cpu / passes * 1000:.2f} ms CPU a pass, {cpu / max(placed, 1) * 1000:.2f} ms a placed "
          f"job{' (profiled)' if args.top else ''}")  # fmt: skip
    if args.sql:
        total = sum(statements.values())
        print(f"statements: {total / passes:.1f} a pass, {total / max(placed, 1):.2f} a placed job")
        for head, n in statements.most_common(30):
            print(f"  {n / passes:6.2f} a pass  {head}")
    if args.top:
        pstats.Stats(profile).sort_stats(args.sort).print_stats(args.top)


if __name__ == "__main__":
    sys.exit(main())
