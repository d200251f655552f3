"""One side of an in-process A/B pair for the submit (h40submit's notes): 8 threads, each with
Django's test client, `POST /api/v1/jobs/ {"command": ["true"], "gpus": 1}` (the bench's body),
as bob (tests/e2e/seed.py), on a fresh database (SQLite, or PostgreSQL beside DATABASE_URL's).

    python -m bench._h40submit_pairs [--batches 3] [--per-thread 40] [--threads 8]

Before each batch the queue is emptied (an UPDATE), so that the replay stays under its
QUEUE_LIMIT. Prints one JSON line: this process's CPU ms a submit (the test client included:
the same in both trees) and, on PostgreSQL, its backends' (each thread's connection, from /proc).
"""

from __future__ import annotations

import argparse
import faulthandler
import json
import threading
import time

from bench._in_process import django_in_process


def backend_cpu() -> float:
    from django.db import connection

    if connection.vendor != "postgresql":
        return 0.0
    import psutil

    connection.ensure_connection()
    times = psutil.Process(connection.connection.info.backend_pid).cpu_times()
    return times.user + times.system


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--batches", type=int, default=3)
    parser.add_argument("--per-thread", type=int, default=40)
    parser.add_argument("--threads", type=int, default=8)
    args = parser.parse_args()
    with django_in_process() as token:
        from django.core.management import call_command
        from django.db import connection
        from django.test import Client

        from apps.jobs.models import Job

        call_command("set_quota", "acme", "--max-queued-jobs", "100000",
                     "--submit-rate", "1000000", "--submit-burst", "100000", stdout=open("/dev/null", "w"))  # fmt: skip
        body = {"command": ["true"], "gpus": 1}
        server_cpu = [0.0] * args.threads
        start = threading.Barrier(args.threads + 1)
        done = threading.Barrier(args.threads + 1)

        def worker(n: int) -> None:
            try:
                work(n)
            except BaseException:
                start.abort()  # the others stop waiting; the run fails
                done.abort()
                raise

        def work(n: int) -> None:
            client = Client(HTTP_AUTHORIZATION=f"Token {token}")
            for _ in range(5):
                assert (
                    client.post("/api/v1/jobs/", body, content_type="application/json").status_code
                    == 201
                )
            for _ in range(args.batches):
                start.wait()
                before = backend_cpu()
                for _ in range(args.per_thread):
                    answer = client.post("/api/v1/jobs/", body, content_type="application/json")
                    assert answer.status_code == 201, answer.content
                server_cpu[n] += backend_cpu() - before
                done.wait()
            connection.close()

        threads = [threading.Thread(target=worker, args=(n,)) for n in range(args.threads)]
        for t in threads:
            t.start()
        cpu = wall = 0.0
        # A batch takes seconds: one that is still running after 90 is stuck (seen twice under
        # load): every thread's stack to stderr, and the run ends.
        faulthandler.dump_traceback_later(90, repeat=False, exit=True)
        for _ in range(args.batches):
            time.sleep(0.3)
            Job.objects.filter(state="queued").update(state="cancelled")
            began, c0 = time.perf_counter(), time.process_time()
            start.wait()
            done.wait()
            cpu += time.process_time() - c0
            wall += time.perf_counter() - began
        for t in threads:
            t.join()
        faulthandler.cancel_dump_traceback_later()
        count = args.batches * args.per_thread * args.threads
        print(json.dumps({"web_ms": round(cpu / count * 1000, 3), "pg_ms": round(sum(server_cpu) / count * 1000, 3),
                          "wall_ms": round(wall / count * 1000, 3), "submits": count}))  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
