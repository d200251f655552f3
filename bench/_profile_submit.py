"""Profile the submit path in one process: `POST /api/v1/jobs/` through Django's test client
(the whole middleware stack, DRF, admission, the database and Redis), under cProfile.

    python -m bench._profile_submit [--count 500] [--top 40] [--sort tottime] [--cpu]

A fresh SQLite file (or a fresh PostgreSQL database beside DATABASE_URL's) and an embedded
Redis; the e2e cast (tests/e2e/seed.py). Prints the CPU per submit (on PostgreSQL its backend's
too) and cProfile's top rows.
Not part of `make bench` (a tool for finding the cost, not a figure).
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import sys
import time

from bench._in_process import django_in_process


def database_server_cpu() -> float | None:
    """CPU seconds (user + system) the PostgreSQL backend of this thread's connection has used
    (the server's share of a submit, on the same cores in a one-machine set-up); None on SQLite,
    whose work is this process's own. psutil reads /proc in 10 ms ticks: count hundreds."""
    from django.db import connection

    if connection.vendor != "postgresql":
        return None
    import psutil

    connection.ensure_connection()
    times = psutil.Process(connection.connection.info.backend_pid).cpu_times()
    return times.user + times.system


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--count", type=int, default=500)
    parser.add_argument("--top", type=int, default=40)
    parser.add_argument("--sort", default="tottime")
    parser.add_argument(
        "--cpu", action="store_true",
        help="profile with the process's CPU clock (time.process_time) instead of the wall's: "
        "a round trip's wait on the database then counts for nothing",
    )  # fmt: skip
    args = parser.parse_args()
    with django_in_process() as token:
        from django.core.management import call_command
        from django.test import Client

        call_command("set_quota", "acme", "--max-queued-jobs", "100000",
                     "--submit-rate", "1000000", "--submit-burst", "100000")  # fmt: skip
        client = Client(HTTP_AUTHORIZATION=f"Token {token}")
        body = {"command": ["true"], "gpus": 1}

        def post() -> None:
            answer = client.post("/api/v1/jobs/", body, content_type="application/json")
            assert answer.status_code == 201, answer.content

        for _ in range(20):  # warm: imports, the process's caches
            post()
        began, cpu = time.perf_counter(), time.process_time()
        profile = cProfile.Profile(time.process_time) if args.cpu else cProfile.Profile()
        profile.enable()
        for _ in range(args.count):
            post()
        profile.disable()
        cpu = time.process_time() - cpu
        wall = time.perf_counter() - began
        print(f"{args.count} submits: {cpu / args.count * 1000:.2f} ms CPU each (profiled), "
              f"{wall / args.count * 1000:.2f} ms wall")  # fmt: skip
        server = database_server_cpu()
        began, cpu = time.perf_counter(), time.process_time()
        for _ in range(args.count):
            post()
        cpu = time.process_time() - cpu
        print(f"unprofiled: {cpu / args.count * 1000:.2f} ms CPU each, "
              f"{(time.perf_counter() - began) / args.count * 1000:.2f} ms wall")  # fmt: skip
        if server is not None:
            used = database_server_cpu() - server
            print(
                f"the PostgreSQL backend serving them: {used / args.count * 1000:.2f} ms CPU each"
            )
        pstats.Stats(profile).sort_stats(args.sort).print_stats(args.top)
    return 0


if __name__ == "__main__":
    sys.exit(main())
