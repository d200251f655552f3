"""Foundation figures through the whole stack (real processes, fake GPUs):

1. submit-to-running latency on an idle cluster, p50/p95 over N jobs submitted one at a time;
2. jobs started per second with 8 fake nodes x 8 GPUs draining M one-GPU jobs that exit at once.

`python -m bench.foundation [--quick]` writes docs/bench/10-foundation.md. Uses the embedded
default (SQLite + bundled Redis) unless DATABASE_URL / REDIS_URL are set.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import contextlib
import os
import pathlib
import signal
import statistics
import sys
import tempfile
import threading
import time
from datetime import datetime

ROOT = pathlib.Path(__file__).resolve().parent.parent
OUT = ROOT / "docs" / "bench" / "10-foundation.md"


def ts(text: str) -> float:
    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]


@contextlib.contextmanager
def running_platform(data_dir: pathlib.Path, nodes: dict, name: str):
    """A whole platform for one measurement, stopped (with its embedded Redis) afterwards, also
    when the bench is stopped by SIGTERM (`timeout`, a CI's cancel): Python's default for it
    ends the process without unwinding, and the platform's processes ran on, loading the next
    runs' pairs (docs/bench/71-slurm-peer-notes.md, the fifth session's passes)."""
    stop_on_sigterm()
    platform, redis_server = start_platform(data_dir, nodes, name)
    try:
        yield platform
    finally:
        platform.stop()
        if redis_server:
            redis_server.stop()
            os.environ.pop("REDIS_URL", None)


def stop_on_sigterm() -> None:
    """SIGTERM raises SystemExit (in the main thread), so that `finally` blocks run."""
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, _exit_on_sigterm)


def _exit_on_sigterm(signum, frame) -> None:
    signal.signal(signal.SIGTERM, signal.SIG_DFL)  # a second one ends the bench at once
    raise SystemExit(128 + signum)


def all_jobs(platform):
    """Every job of bob's tenant, page by page."""
    url = "/api/v1/jobs/?page=1"
    while url:
        page = platform.get("bob", url.replace(platform.url, "")).json()
        yield from page["results"]
        url = page["next"]


def wait_until_ended(platform, count: int, interval: float) -> None:
    # Counts only (a page of one job), as Slurm's poll is `squeue -h -o %i | head -1`: a page of
    # 50 jobs with their attempts, twice a poll, was a tenth of the web's py-spy samples in a drain.
    def ended() -> bool:
        counts = [
            platform.get("bob", f"/api/v1/jobs/?state={s}&page_size=1").json()["count"]
            for s in ("succeeded", "failed")
        ]
        return sum(counts) >= count

    platform.wait_until(ended, timeout=1800, what=f"{count} jobs ended", interval=interval)


def start_platform(data_dir: pathlib.Path, nodes: dict, name: str):
    os.environ.setdefault("SECRET_KEY", "bench-only")
    redis_server = None
    if not os.environ.get("REDIS_URL"):
        from gpuplatform import embedded_redis

        redis_server = embedded_redis.start(data_dir / "redis", persist=False)
        os.environ["REDIS_URL"] = redis_server.url
    from tests.e2e.platform import Platform

    platform = Platform(data_dir / name, name=f"gpuplatform_bench_{name}", redis_db=2)
    (data_dir / name).mkdir(parents=True, exist_ok=True)
    platform.env["GPUPLATFORM_DATA_DIR"] = str(data_dir / name)
    # Production timings for liveness: the tests' fast heartbeats lose live nodes under this load.
    platform.env["GPUPLATFORM_HEARTBEAT_SECONDS"] = "2"
    platform.start(nodes)
    platform.manage(
        "set_quota",
        "acme",
        "--max-queued-jobs",
        "100000",
        "--submit-rate",
        "1000000",
        "--submit-burst",
        "100000",
    )
    return platform, redis_server


def latency(count: int, data_dir: pathlib.Path) -> dict:
    with running_platform(data_dir, {"lat-h1": ("H100-80GB", 8, "")}, "latency") as platform:
        samples = []
        for _ in range(count):
            job = platform.submit("bob", command=["true"], gpus=1, gpu_sku="H100-80GB")
            done = platform.wait_for_state(job["id"], ["succeeded", "failed"], timeout=60)
            samples.append(ts(done["attempts"][0]["started_at"]) - ts(done["created_at"]))
        return {"n": count, "p50": statistics.median(samples), "p95": percentile(samples, 0.95)}


def throughput(count: int, data_dir: pathlib.Path) -> dict:
    nodes = {f"tp-{i}": ("H100-80GB", 8, "") for i in range(8)}
    with running_platform(data_dir, nodes, "throughput") as platform:
        submit_started = time.monotonic()
        with concurrent.futures.ThreadPoolExecutor(8) as pool:
            list(pool.map(lambda _: platform.submit("bob", command=["true"], gpus=1, gpu_sku="H100-80GB")["id"],
                          range(count)))  # fmt: skip
        submit_seconds = time.monotonic() - submit_started
        wait_until_ended(platform, count, interval=2)
        starts, created, retried = [], [], []
        for job in all_jobs(platform):
            if job["state"] != "succeeded" or len(job["attempts"]) > 1:
                retried.append([(a["state"], a["reason"]) for a in job["attempts"]])
            if job["state"] == "succeeded":
                starts.append(ts(job["attempts"][-1]["started_at"]))
                created.append(ts(job["created_at"]))
        span = max(starts) - min(starts)
        return {
            "n": count, "nodes": 8, "gpus": 64, "submit_seconds": submit_seconds,
            "submits_per_second": count / submit_seconds, "start_span_seconds": span,
            "starts_per_second": count / span if span else float("inf"),
            "drain_seconds": max(starts) - min(created), "retried": retried,
        }  # fmt: skip


def peer_drain(count: int, data_dir: pathlib.Path) -> dict:
    """Slurm's b4 shape (peers/slurm/bench.sh): `count` one-GPU jobs that exit at once, all queued
    first, then drained by 4 nodes x 4 GPUs (16 at a time)."""
    with running_platform(data_dir, {}, "peer") as platform:
        with concurrent.futures.ThreadPoolExecutor(8) as pool:
            list(pool.map(lambda _: platform.submit("bob", command=["true"], gpus=1), range(count)))
        opened = time.monotonic()
        for i in range(4):
            platform.start_agent(f"peer-{i}", "H100-80GB", 4)
        wait_until_ended(platform, count, interval=0.5)
        wall = time.monotonic() - opened
        attempts = [job["attempts"][-1] for job in all_jobs(platform)]
        # First start to last end: the agents are already up then, like Slurm's partition UP.
        drain = max(ts(a["ended_at"]) for a in attempts) - min(
            ts(a["started_at"]) for a in attempts
        )
        return {
            "n": count,
            "drain_seconds": drain,
            "jobs_per_second": count / drain,
            "wall_seconds": wall,
        }


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true", help="20 latency samples, 200 jobs drained")
    args = parser.parse_args()
    n_latency, n_drain = (20, 200) if args.quick else (100, 2000)
    backend = (
        "PostgreSQL"
        if os.environ.get("DATABASE_URL", "").startswith("postgres")
        else "SQLite (embedded default)"
    )
    with tempfile.TemporaryDirectory(prefix="gpuplatform-bench-") as tmp:
        lat = latency(n_latency, pathlib.Path(tmp))
        print(f"latency: {lat}", flush=True)
        tp = throughput(n_drain, pathlib.Path(tmp))
        print(f"throughput: {tp}", flush=True)
        peer = peer_drain(n_drain // 2, pathlib.Path(tmp))
        print(f"peer drain: {peer}", flush=True)
    command = "python -m bench.foundation" + (" --quick" if args.quick else "")
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(f"""## Foundation: the whole stack

Command: `{command}` ({backend}, Redis, gunicorn 2x4, one dispatcher, fake GPU agents; all on the
2-core machine, so the agents, the web and the dispatcher share two cores).

| figure | value |
|---|---|
| submit-to-running latency, idle cluster, p50 over {lat["n"]} jobs | {lat["p50"] * 1000:.0f} ms |
| submit-to-running latency, idle cluster, p95 over {lat["n"]} jobs | {lat["p95"] * 1000:.0f} ms |
| jobs started per second, 8 nodes x 8 GPUs draining {tp["n"]} one-GPU jobs that exit at once | {tp["starts_per_second"]:.1f} /s |
| time from first submit to last start ({tp["n"]} jobs) | {tp["drain_seconds"]:.1f} s |
| submits per second while filling the queue (8 client threads) | {tp["submits_per_second"]:.1f} /s |
| jobs retried or failed during the drain | {len(tp["retried"])} |
| Slurm's b4 shape: {peer["n"]} one-GPU jobs queued first, then drained by 4 nodes x 4 GPUs | {peer["jobs_per_second"]:.1f} jobs/s ({peer["drain_seconds"]:.1f} s from the first start to the last end) |

Latency is measured from the job's `created_at` to its attempt's `started_at` (server clocks,
no client overhead): dispatch trigger on commit, placement, the start message to the node queue,
the agent spawning the process and reporting it started.
""")
    return 0


if __name__ == "__main__":
    sys.exit(main())
