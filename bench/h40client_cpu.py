"""The client's own CPU a submit (issue 35: the bench's clients share the 2 cores with the web).

    python -m bench.h40client_cpu [--pairs 10] [--count 300] [--threads 8] [--old-client DIR]

One platform (no nodes: every job stays queued), then rounds of one client process per kind,
the kinds' order turned each round: `requests` (a `requests.Session` a thread, as
tests/e2e/platform.py's `api()` and bench.slurm_peer's `--client requests`), `old` (the SDK of
another checkout, `--old-client DIR/client`: urllib, a connection a call) and `sdk` (this
checkout's: a kept connection a thread). Each client process submits `count` one-GPU `true`
jobs from `threads` threads, after a few to warm up, and prints `time.process_time()` (all its
threads) across them divided by `count`: the client's CPU a submit, without the web's. Prints a
JSON line a process and the medians. A tool for a figure in the notes, not part of `make bench`.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import statistics
import subprocess
import sys
import tempfile
import threading
import time

ROOT = pathlib.Path(__file__).resolve().parent.parent
KINDS = ("requests", "old", "sdk")
WARM = 4  # submits a thread before the measured ones: connections opened, code paths warm
BODY = {"command": ["true"], "gpus": 1}


def submitter(kind: str, url: str, token: str):
    """A function that submits one job, for one thread."""
    if kind == "requests":
        import requests

        session = requests.Session()
        session.headers["Authorization"] = f"Token {token}"

        def submit() -> None:
            answer = session.post(url + "/api/v1/jobs/", json=BODY, timeout=60)
            assert answer.status_code == 201, answer.text

        return submit
    client = shared_client(url, token)
    return lambda: client.submit(**BODY)


_clients: dict = {}


def shared_client(url: str, token: str):
    """One Client for every thread (it keeps a connection a thread itself)."""
    if url not in _clients:
        from gpuplatform_client import Client

        _clients[url] = Client(url, token, timeout=60)
    return _clients[url]


def child(kind: str, url: str, token: str, count: int, threads: int) -> dict:
    """In the client process: `count` submits from `threads` threads, process CPU across them."""
    import gpuplatform_client

    shares = [count // threads + (i < count % threads) for i in range(threads)]
    ready = threading.Barrier(threads + 1)
    go = threading.Event()

    failures: list[BaseException] = []

    def work(share: int) -> None:
        try:
            submit = submitter(kind, url, token)
            for _ in range(WARM):
                submit()
            ready.wait()
            go.wait()
            for _ in range(share):
                submit()
        except BaseException as error:  # reported by the process; the others stop waiting
            failures.append(error)
            ready.abort()
            raise

    workers = [threading.Thread(target=work, args=(share,)) for share in shares]
    for worker in workers:
        worker.start()
    try:
        ready.wait()
    finally:
        go.set()
    cpu, began = time.process_time(), time.monotonic()
    for worker in workers:
        worker.join()
    if failures:
        raise SystemExit(f"{kind}: a client thread failed: {failures[0]!r}")
    cpu, wall = time.process_time() - cpu, time.monotonic() - began
    return {
        "kind": kind,
        "client_cpu_ms_per_submit": round(cpu / count * 1000, 3),
        "submits_per_second": round(count / wall, 1),
        "sdk": str(pathlib.Path(gpuplatform_client.__file__).parent),
    }


def run_child(kind: str, url: str, token: str, args) -> dict:
    env = dict(os.environ)
    if kind == "old":
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [args.old_client, str(ROOT)]))
    else:
        env["PYTHONPATH"] = str(ROOT)
    command = [sys.executable, "-m", "bench.h40client_cpu", "--child", kind, "--url", url,
               "--token", token, "--count", str(args.count), "--threads", str(args.threads)]  # fmt: skip
    out = subprocess.run(command, env=env, cwd=ROOT, capture_output=True, text=True, timeout=600)
    if out.returncode:
        raise SystemExit(f"the {kind} client failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--pairs", type=int, default=10, help="rounds, each kind once a round")
    parser.add_argument("--count", type=int, default=300, help="measured submits a process")
    parser.add_argument("--threads", type=int, default=8)
    parser.add_argument("--old-client", help="another checkout's client/ directory (the old SDK)")
    parser.add_argument("--child", choices=KINDS, help=argparse.SUPPRESS)
    parser.add_argument("--url", help=argparse.SUPPRESS)
    parser.add_argument("--token", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(args.child, args.url, args.token, args.count, args.threads)))
        return 0
    kinds = KINDS if args.old_client else ("requests", "sdk")
    from bench.foundation import running_platform

    results: dict[str, list[float]] = {kind: [] for kind in kinds}
    with (
        tempfile.TemporaryDirectory(prefix="gpuplatform-clientcpu-") as tmp,
        running_platform(pathlib.Path(tmp), {}, "clientcpu") as platform,
    ):
        token = platform.tokens["bob"]
        for number in range(args.pairs):
            order = kinds[number % len(kinds) :] + kinds[: number % len(kinds)]
            load = os.getloadavg()[0]
            for kind in order:
                result = run_child(kind, platform.url, token, args)
                result.update(round=number + 1, load=round(load, 1))
                results[kind].append(result["client_cpu_ms_per_submit"])
                print(json.dumps(result), flush=True)
    for kind in kinds:
        values = results[kind]
        print(f"{kind}: median {statistics.median(values):.3f} ms a submit "
              f"(min {min(values):.3f}, max {max(values):.3f}, {len(values)} processes)")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
