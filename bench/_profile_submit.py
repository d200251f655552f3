"""Profile the submit path in one process: `POST /api/v1/jobs/` through Django's test client
(the whole middleware stack, DRF, admission, the database and Redis), under cProfile.

    python -m bench._profile_submit [--count 500] [--top 40] [--sort tottime] [--cpu]
    python -m bench._profile_submit --http [--count 2000] [--threads 4] [--clients 8]

A fresh SQLite file (or a fresh PostgreSQL database beside DATABASE_URL's) and an embedded
Redis; the e2e cast (tests/e2e/seed.py). Prints the CPU per submit (on PostgreSQL its backend's
too) and cProfile's top rows.

`--http`: the same submits through the server instead (the Procfile's web with one master of one
worker, access log on, 8 keep-alive clients), and the worker's CPU a submit split by thread: the
event loop's (uvicorn, the router and the hand-off in gpuplatform/asgi.py, the access line)
against the others (the lane's threads running Django). Run it from two trees in turn to compare
them; py-spy can attach to the printed pid.
Not part of `make bench` (a tool for finding the cost, not a figure).
"""

from __future__ import annotations

import argparse
import cProfile
import http.client
import json
import os
import pathlib
import pstats
import subprocess
import sys
import threading
import time

from bench._in_process import ROOT, django_in_process

PORT = 18641


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
    parser.add_argument("--http", action="store_true", help="through the web server")
    parser.add_argument("--threads", type=int, default=4, help="--http: the worker's threads")
    parser.add_argument("--clients", type=int, default=8, help="--http: keep-alive clients")
    args = parser.parse_args()
    with django_in_process() as token:
        from django.core.management import call_command
        from django.test import Client

        call_command("set_quota", "acme", "--max-queued-jobs", "10000000",
                     "--submit-rate", "1000000", "--submit-burst", "100000")  # fmt: skip
        if args.http:
            return through_the_server(token, args)
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


def through_the_server(token: str, args: argparse.Namespace) -> int:
    log = open(pathlib.Path(os.environ["GPUPLATFORM_DATA_DIR"]) / "web.log", "w")  # noqa: SIM115
    web = subprocess.Popen(
        [sys.executable, "-m", "gpuplatform.web", f"--bind=127.0.0.1:{PORT}", "--workers", "1",
         "--threads", str(args.threads), "--access-logfile", "-"],
        cwd=ROOT, stdout=log, stderr=subprocess.STDOUT,
    )  # fmt: skip
    try:
        headers = {"Authorization": f"Token {token}", "Content-Type": "application/json"}
        body = json.dumps({"command": ["true"], "gpus": 1})
        burst(headers, body, args.clients, 25, patient=True)  # warm, and wait for it to listen
        worker = the_worker(web.pid)
        before, wall = thread_cpu(worker), time.perf_counter()
        burst(headers, body, args.clients, args.count // args.clients)
        after, wall = thread_cpu(worker), time.perf_counter() - wall
        count = args.count // args.clients * args.clients
        loop = after.pop(worker) - before.pop(worker)
        rest = sum(after.values()) - sum(before.get(tid, 0.0) for tid in after)
        print(f"{count} submits through the server (worker pid {worker}): {count / wall:.0f}/s; "
              f"the worker's CPU a submit {(loop + rest) / count * 1e6:.0f} us, of which the "
              f"event loop's thread {loop / count * 1e6:.0f} us, the others "
              f"{rest / count * 1e6:.0f} us")  # fmt: skip
    finally:
        web.terminate()
        web.wait(30)
    return 0


def burst(headers: dict, body: str, clients: int, each: int, patient: bool = False) -> None:
    def client() -> None:
        connection = http.client.HTTPConnection("127.0.0.1", PORT, timeout=60)
        for _ in range(each):
            connection.request("POST", "/api/v1/jobs/", body=body, headers=headers)
            answer = connection.getresponse()
            assert answer.status == 201, answer.read()
            answer.read()
        connection.close()

    deadline = time.monotonic() + (60 if patient else 0)
    while True:
        try:
            http.client.HTTPConnection("127.0.0.1", PORT, timeout=5).connect()
            break
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)
    threads = [threading.Thread(target=client) for _ in range(clients)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()


def the_worker(launcher: int) -> int:
    """The uvicorn worker: the launcher's grandchild (launcher -> gunicorn master -> worker)."""
    import psutil

    (worker,) = [p for p in psutil.Process(launcher).children(recursive=True) if not p.children()]
    return worker.pid


def thread_cpu(pid: int) -> dict[int, float]:
    """CPU seconds (user + system) of each thread of a process, from /proc (10 ms ticks)."""
    tick, seconds = os.sysconf("SC_CLK_TCK"), {}
    for task in pathlib.Path(f"/proc/{pid}/task").iterdir():
        try:
            fields = (task / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue  # the thread ended
        seconds[int(task.name)] = (int(fields[11]) + int(fields[12])) / tick
    return seconds


if __name__ == "__main__":
    sys.exit(main())
