"""What GPU telemetry costs (docs/telemetry.md), through the whole stack (real processes, fake
GPUs), sampling on (every 0.5 s, 20 times the default rate) against off (once an hour), in P
interleaved pairs (off then on, then on then off, ...), medians of each:

1. a drain: 4 nodes x 8 GPUs running M one-GPU jobs of 1 s each, first submit to last end;
2. submit-to-running on an idle cluster, p50 over N jobs submitted one at a time;
3. once: the samples one web process absorbs, `apps.telemetry.ingest.ingest` called in this
   process (one core) against the platform's own database (its processes stopped first), 8 GPUs
   x 5 samples a heartbeat, 2,000 samples a GPU (each series compacted twice past 1,000 points).

`python -m bench.telemetry [--jobs M] [--latency N] [--pairs P]` writes
docs/bench/60-telemetry.md, or docs/bench/60-telemetry-postgres.md where DATABASE_URL is a
PostgreSQL one (each platform then gets its own database beside it).
"""

from __future__ import annotations

import argparse
import concurrent.futures
import os
import pathlib
import statistics
import sys
import tempfile
import time

from bench.foundation import running_platform, ts, wait_until_ended

ROOT = pathlib.Path(__file__).resolve().parent.parent
OUT = ROOT / "docs" / "bench" / "60-telemetry.md"
SKU = "H100-80GB"


def sampling(seconds: str):
    """A running_platform whose web hands its agents this sampling interval."""
    os.environ["GPUPLATFORM_GPU_SAMPLE_SECONDS"] = seconds  # the platform's env copies os.environ


def drain(count: int, data_dir: pathlib.Path, name: str) -> float:
    nodes = {f"{name}-{i}": (SKU, 8, "") for i in range(4)}
    with running_platform(data_dir, nodes, name) as platform:
        with concurrent.futures.ThreadPoolExecutor(4) as pool:
            ids = list(pool.map(lambda _: platform.submit("bob", command=["sleep", "1"], gpus=1,
                                                          gpu_sku=SKU)["id"], range(count)))  # fmt: skip
        wait_until_ended(platform, count, interval=2)
        jobs = [platform.job(job_id, "bob") for job_id in ids]
        return max(ts(j["attempts"][-1]["ended_at"]) for j in jobs) - min(
            ts(j["created_at"]) for j in jobs
        )


def latency(count: int, data_dir: pathlib.Path, name: str, *, ingest_rate: bool) -> dict:
    with running_platform(data_dir, {f"{name}-h1": (SKU, 8, "")}, name) as platform:
        waits = []
        for _ in range(count):
            job = platform.submit("bob", command=["true"], gpus=1, gpu_sku=SKU)
            done = platform.wait_for_state(job["id"], ["succeeded", "failed"], timeout=60)
            waits.append(ts(done["attempts"][0]["started_at"]) - ts(done["created_at"]))
        figures = {"p50": statistics.median(waits)}
        if ingest_rate:
            figures["samples_per_second"] = ingest_per_second(platform, f"{name}-h1")
        return figures


def ingest_per_second(platform, node: str, heartbeats: int = 400) -> float:
    """Samples a second that ingest stores, in this process, for one 8-GPU job on `node`."""
    import signal

    job = platform.submit("bob", command=["sleep", "600"], gpus=8, gpu_sku=SKU)
    platform.wait_for_state(job["id"], "running")
    # The platform's processes stopped where they stand (the job stays open in the database), so
    # the figure is ingest's own, not its wait for SQLite's one writer.
    for name in list(platform.processes):
        platform.kill(name, signal.SIGKILL, group=True)
    os.environ.update(DATABASE_URL=platform.env["DATABASE_URL"], REDIS_URL=platform.env["REDIS_URL"],
                      DJANGO_SETTINGS_MODULE="gpuplatform.settings")  # fmt: skip
    import django

    django.setup()
    from apps.jobs.models import AttemptMember
    from apps.telemetry.ingest import ingest

    member = AttemptMember.objects.get(attempt__job_id=job["id"])
    t = time.time() - 3000
    began = time.perf_counter()
    stored = 0
    for _ in range(heartbeats):
        batch = []
        for _ in range(5):
            t += 1
            batch += [{"t": t, "index": i, "attempt_id": member.attempt_id, "rank": 0, "util": 50,
                       "memory_mib": 1000, "seconds": 1} for i in member.gpu_indices]  # fmt: skip
        stored += ingest(node, batch)
    return stored / (time.perf_counter() - began)


def database() -> str:
    url = os.environ.get("DATABASE_URL", "")
    return "PostgreSQL" if url.startswith(("postgres://", "postgresql://")) else "SQLite"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=200, help="jobs in each drain")
    parser.add_argument("--latency", type=int, default=20, help="jobs for submit-to-running")
    parser.add_argument("--pairs", type=int, default=3, help="interleaved off/on pairs")
    parser.add_argument("--ingest-only", action="store_true", help="only the ingest rate (printed)")
    args = parser.parse_args()
    settings = {"off": "3600", "on": "0.5"}
    with tempfile.TemporaryDirectory(prefix="gpuplatform-bench-telemetry-") as tmp:
        if args.ingest_only:
            sampling(settings["on"])
            print(latency(1, pathlib.Path(tmp), "ingest", ingest_rate=True))
            return 0
        load = os.getloadavg()[0]
        runs: dict[str, dict[str, list[float]]] = {k: {"drain": [], "p50": []} for k in settings}
        for pair in range(args.pairs):
            order = ("off", "on") if pair % 2 == 0 else ("on", "off")
            for label in order:
                sampling(settings[label])
                runs[label]["drain"].append(
                    drain(args.jobs, pathlib.Path(tmp), f"dr-{label}{pair}")
                )
            for label in order:
                sampling(settings[label])
                figures = latency(
                    args.latency, pathlib.Path(tmp), f"la-{label}{pair}", ingest_rate=False
                )
                runs[label]["p50"].append(figures["p50"])
            print(pair, runs, flush=True)
        sampling(settings["on"])
        rate = latency(1, pathlib.Path(tmp), "ingest", ingest_rate=True)["samples_per_second"]
    write(args, runs, rate, load)
    return 0


def write(args, runs: dict, rate: float, load: float) -> None:
    def cell(values: list[float], unit: str, digits: int) -> str:
        spread = f"{min(values):.{digits}f}-{max(values):.{digits}f}"
        return f"{statistics.median(values):.{digits}f} {unit} ({spread})"

    def ratio(what: str) -> str:
        return f"{statistics.median(runs['on'][what]) / statistics.median(runs['off'][what]):.3f}"

    db = database()
    out = OUT if db == "SQLite" else OUT.with_name("60-telemetry-postgres.md")
    command = f"python -m bench.telemetry --jobs {args.jobs} --latency {args.latency} --pairs {args.pairs}"
    if db != "SQLite":
        command = f"DATABASE_URL=postgres://... {command}"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(f"""## GPU telemetry ({db})

`{command}` (docs/telemetry.md). Sampling "on" is every 0.5 s (20 times the default 10 s), "off"
once an hour; {args.pairs} pairs, interleaved (off/on, then on/off, ...): medians, (range). Load
average when it started: {load:.1f} on {os.cpu_count()} cores, a machine shared with other work
(it moves these figures).

| figure | sampling off | sampling on | on / off (medians) |
|---|---|---|---|
| drain: {args.jobs} one-GPU jobs of 1 s on 4 nodes x 8 GPUs, first submit to last end | {cell(runs["off"]["drain"], "s", 1)} | {cell(runs["on"]["drain"], "s", 1)} | {ratio("drain")} |
| submit-to-running p50, idle cluster ({args.latency} jobs) | {cell(runs["off"]["p50"], "s", 3)} | {cell(runs["on"]["p50"], "s", 3)} | {ratio("p50")} |
| samples one web core stores a second (8 GPUs x 5 samples a heartbeat) | | {rate:,.0f} /s | |
""")  # fmt: skip
    print(out.read_text())


if __name__ == "__main__":
    sys.exit(main())
