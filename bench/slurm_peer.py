"""Beside Slurm, in one run (issue 35): interleaved pairs, ours then Slurm's, each pair printed,
then the medians and the ratios.

Each pair measures, on both sides, with the same shapes:

1. submits/s from 8 clients: `count` one-GPU `true` jobs submitted by 8 concurrent clients while
   nothing can start, first POST (or `sbatch`) to last answer. Slurm: the partition DOWN, its
   nodes up. Ours: the 4 nodes registered, then their agents stopped until the platform holds
   them lost (known, as Slurm's are: a submit is checked against their shapes, apps/admission/fit.py);
2. the drain of those queued jobs by 4 nodes x 4 fake GPUs (16 at a time): ours from the first
   attempt's start to the last one's end (server clocks), Slurm's from `partition UP` until
   `squeue` is empty (polled every 0.2 s, as ../shared/peers/slurm/bench.sh does); ours with the
   agents started again;
3. submit to running on the idle cluster: from the client's clock just before its POST (or
   `sbatch`) to the job's own first instruction, `date +%s.%N` (ours: read from the job's log,
   Slurm's: from the file its script writes), `latency` samples a pair, 0-1 s apart.

Our 8 clients are the product's own: one SDK `Client` (gpuplatform_client, one kept connection a
thread), as Slurm's side runs `sbatch`. `--client requests` submits through a `requests.Session` a
thread instead (the bench's clients before the h40client pass), to compare the two in one run.

Besides, our web's CPU (gunicorn's master and workers, from psutil: /proc/<pid>/stat) divided
by the submits and by the jobs ended in the drain (which includes the nodes' registrations and heartbeats and the
bench's own polls: two count queries a second); and on both sides the clients' own CPU a submit:
the bench process's CPU across the submit phase (its 8 client threads; `time.process_time`) plus
that of the children it reaped meanwhile (Slurm's `sbatch` processes; none on ours), since the
clients share the machine's 2 cores with the server they measure.

    SCHED_PARAMS=batch_sched_delay=0 bash ../shared/peers/slurm/setup.sh   # the lab, tuned
    python -m bench.slurm_peer [--pairs 5] [--count 1000] [--latency 10] [--client sdk|requests]

`--unfenced`: our agents run their jobs with GPUPLATFORM_ISOLATION=none (no uid, cgroup or mount
namespace; Slurm's lab runs its jobs with no cgroups either): what the fence costs, labelled so
in the section. The fenced run is the headline.

SQLite (the embedded default) unless DATABASE_URL names PostgreSQL. Writes
docs/bench/70-slurm-peer-sqlite.md or -postgresql.md (or its --out) with every pair and the medians.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import itertools
import json
import os
import pathlib
import random
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from datetime import UTC, datetime

from bench.foundation import all_jobs, running_platform, ts, wait_until_ended

ROOT = pathlib.Path(__file__).resolve().parent.parent
SECTIONS = ROOT / "docs" / "bench"
LAB = pathlib.Path(os.environ.get("LAB", "/tmp/slurmlab"))
SLURM_ENV = dict(os.environ, SLURM_CONF=str(LAB / "etc" / "slurm.conf"))
CLIENTS = 8
NODES, GPUS = 4, 4


def own_cpu_seconds() -> float:
    """This process's CPU (every thread) and that of its children reaped so far (`sbatch`)."""
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return time.process_time() + children.ru_utime + children.ru_stime


def cpu_seconds(pid: int) -> float:
    """The process's CPU and its descendants' (gunicorn's workers), live and reaped."""
    import psutil

    process = psutil.Process(pid)
    total = 0.0
    for each in [process, *process.children(recursive=True)]:
        try:
            times = each.cpu_times()
        except psutil.Error:
            continue
        total += times.user + times.system + times.children_user + times.children_system
    return total


# --- ours -------------------------------------------------------------------------------------


def nodes_lost(platform, nodes) -> None:
    """Stop the nodes' agents and wait until the platform counts them lost: registered, taking
    no work (Slurm's partition DOWN with its nodes up)."""
    for node in nodes:
        platform.kill(f"agent-{node}", group=True)
    platform.wait_until(
        lambda: all(n["state"] == "lost" for n in platform.nodes().values()),
        timeout=120, what="the nodes lost",
    )  # fmt: skip


class SdkClients:
    """The product's SDK: one Client, which keeps a connection a thread."""

    def __init__(self, platform):
        from gpuplatform.client import Client

        self.client = Client(platform.url, platform.tokens["bob"], timeout=60)

    def submit(self, body: dict) -> str:
        return self.client.submit(**body)["id"]

    def logs(self, job_id: str) -> str:
        return self.client.logs(job_id)


class RequestsClients:
    """`--client requests`: a `requests.Session` a thread (tests/e2e/platform.py's `api()`)."""

    def __init__(self, platform):
        self.sessions = [platform.api("bob") for _ in range(CLIENTS)]
        self.taken = itertools.count()
        self.local = threading.local()
        self.url = platform.url + "/api/v1/jobs/"

    def session(self):
        if not hasattr(self.local, "session"):
            self.local.session = self.sessions[next(self.taken) % CLIENTS]
        return self.local.session

    def submit(self, body: dict) -> str:
        answer = self.session().post(self.url, json=body, timeout=60)
        assert answer.status_code == 201, answer.text
        return answer.json()["id"]

    def logs(self, job_id: str) -> str:
        return self.session().get(f"{self.url}{job_id}/logs/", timeout=30).text


CLIENT_KINDS = {"sdk": SdkClients, "requests": RequestsClients}


def ours(count: int, samples: int, data_dir: pathlib.Path, client: str = "sdk") -> dict:
    nodes = {f"peer-{i}": ("H100-80GB", GPUS, "") for i in range(NODES)}
    with running_platform(data_dir, nodes, "peer") as platform:
        web = platform.processes["web"].pid
        nodes_lost(platform, nodes)  # Slurm's partition DOWN: the nodes known, none taking work
        clients = CLIENT_KINDS[client](platform)
        body = {"command": ["true"], "gpus": 1}

        def submit(_: int) -> None:
            clients.submit(body)

        cpu, mine = cpu_seconds(web), own_cpu_seconds()
        began = time.monotonic()
        with concurrent.futures.ThreadPoolExecutor(CLIENTS) as pool:
            list(pool.map(submit, range(count)))
        submit_seconds = time.monotonic() - began
        cpu_submit, cpu_clients = cpu_seconds(web) - cpu, own_cpu_seconds() - mine

        cpu = cpu_seconds(web)
        for node in nodes:
            platform.restart_agent(node)
        wait_until_ended(platform, count, interval=1.0)
        cpu_drain = cpu_seconds(web) - cpu
        attempts = [job["attempts"][-1] for job in all_jobs(platform)]
        drain = max(ts(a["ended_at"]) for a in attempts) - min(
            ts(a["started_at"]) for a in attempts
        )

        latencies = []
        for _ in range(samples):
            time.sleep(random.random())
            posted = time.time()
            job_id = clients.submit({"command": ["date", "+%s.%N"], "gpus": 1})
            platform.wait_for_state(job_id, ["succeeded", "failed"], timeout=60)
            latencies.append(first_clock(clients.logs(job_id)) - posted)
    return {
        "submits_per_second": count / submit_seconds,
        "drain_jobs_per_second": count / drain,
        "latency_p50_ms": statistics.median(latencies) * 1000,
        "latencies_ms": [round(x * 1000, 1) for x in latencies],
        "web_cpu_ms_per_submit": cpu_submit / count * 1000,
        "web_cpu_ms_per_job_end": cpu_drain / count * 1000,
        "client_cpu_ms_per_submit": cpu_clients / count * 1000,
        "client": client,
    }


def first_clock(log: str) -> float:
    """The clock `date +%s.%N` printed: the log's first line that reads as a number."""
    for line in log.splitlines():
        try:
            return float(line.strip())
        except ValueError:
            continue
    raise AssertionError(f"no clock in the job's log: {log[:500]!r}")


# --- Slurm's ----------------------------------------------------------------------------------


def slurm(*args: str, check: bool = True) -> str:
    return subprocess.run(args, env=SLURM_ENV, check=check, capture_output=True, text=True).stdout


def slurm_empty() -> None:
    while slurm("squeue", "-h", "-o", "%i").strip():
        time.sleep(0.2)


def theirs(count: int, samples: int, work: pathlib.Path) -> dict:
    slurm("scancel", "-u", "root", check=False)
    slurm_empty()
    slurm("scontrol", "update", "partitionname=gpu", "state=DOWN")
    sbatch = ["sbatch", "-Q", "-o", "/dev/null", "-J", "gpu1", "--gres=gpu:1", "--wrap", "true"]

    def submit(_: int) -> None:
        slurm(*sbatch)

    mine = own_cpu_seconds()
    began = time.monotonic()
    with concurrent.futures.ThreadPoolExecutor(CLIENTS) as pool:
        list(pool.map(submit, range(count)))
    submit_seconds = time.monotonic() - began
    cpu_clients = own_cpu_seconds() - mine

    began = time.monotonic()
    slurm("scontrol", "update", "partitionname=gpu", "state=UP")
    slurm_empty()
    drain = time.monotonic() - began

    latencies = []
    work.mkdir(parents=True, exist_ok=True)
    stamp = work / "started.ts"
    for _ in range(samples):
        time.sleep(random.random())
        stamp.unlink(missing_ok=True)
        posted = time.time()
        slurm("sbatch", "-Q", "-o", "/dev/null", "-J", "lat", "--wrap", f"date +%s.%N > {stamp}")
        while not stamp.exists() or not stamp.read_text().strip():
            time.sleep(0.005)
        latencies.append(float(stamp.read_text()) - posted)
        slurm_empty()
    return {
        "submits_per_second": count / submit_seconds,
        "drain_jobs_per_second": count / drain,
        "latency_p50_ms": statistics.median(latencies) * 1000,
        "latencies_ms": [round(x * 1000, 1) for x in latencies],
        "client_cpu_ms_per_submit": cpu_clients / count * 1000,
    }


# --- the run ----------------------------------------------------------------------------------

FIGURES = (
    ("submits_per_second", "submits/s, 8 clients", "{:.1f}"),
    ("drain_jobs_per_second", "drain, jobs/s", "{:.1f}"),
    ("latency_p50_ms", "submit to first instruction, p50 ms", "{:.0f}"),
    # runs before the h40client pass did not measure it: the row is left out of their sections
    (
        "client_cpu_ms_per_submit",
        "the clients' CPU per submit, ms (ours: the bench's threads; "
        "Slurm's: with its sbatch processes)",
        "{:.2f}",
    ),
)


def section(
    pairs: list[dict],
    *,
    backend: str,
    command: str,
    sched: str,
    when: datetime,
    unfenced: bool = False,
    client: str = "sdk",
) -> str:
    """The run's section: every pair, the medians, and the ratios (of the medians, and the
    median of the pairs' own ratios: each pair ran side by side, so its ratio is the figure)."""
    rows = []
    for key, name, form in FIGURES:
        if not all(key in p["ours"] and key in p["slurm"] for p in pairs):
            continue
        a = statistics.median(p["ours"][key] for p in pairs)
        b = statistics.median(p["slurm"][key] for p in pairs)
        paired = statistics.median(p["ours"][key] / p["slurm"][key] for p in pairs)
        each = ", ".join(
            f"{form.format(p['ours'][key])}/{form.format(p['slurm'][key])}" for p in pairs
        )
        rows.append(f"| {name} | {form.format(a)} | {form.format(b)} | {a / b:.2f}x | "
                    f"{paired:.2f}x | {each} |")  # fmt: skip
    for key, name in (("web_cpu_ms_per_submit", "web CPU per submit, ms"),
                      ("web_cpu_ms_per_job_end", "web CPU per job end (drain), ms")):  # fmt: skip
        a = statistics.median(p["ours"][key] for p in pairs)
        each = ", ".join(f"{p['ours'][key]:.1f}" for p in pairs)
        rows.append(f"| {name} | {a:.1f} | | | | {each} |")
    table = "\n".join(rows)
    if unfenced:
        backend += "; our jobs unfenced, GPUPLATFORM_ISOLATION=none"
    clients = {"sdk": "the SDK's Client, a kept connection a thread",
               "requests": "a requests.Session a thread"}[client]  # fmt: skip
    return f"""## Beside Slurm, interleaved pairs ({backend})

Command: `{command}` ({backend}; Slurm 22.05, SchedulerParameters `{sched}`), on
{when:%Y-%m-%d %H:%M} UTC, on the 2-core development machine (other work may share it: the
1-minute load average at each pair's start says how much): {", ".join(str(p["load"]) for p in pairs)}. Each pair runs ours, then Slurm's.
Our 8 clients: {clients}; Slurm's: `sbatch`.

| figure | ours, median | Slurm, median | ratio of medians | median of pair ratios | each pair, ours/Slurm |
|---|---|---|---|---|---|
{table}
"""


def again(args) -> int:
    with open(args.again) as log:  # the run's printed lines, or its PAIR lines alone (JSON Lines)
        lines = [line.removeprefix("PAIR ") for line in log]
    pairs = [json.loads(line) for line in lines if line.startswith("{")]
    backend = (
        "PostgreSQL" if os.environ.get("DATABASE_URL", "").startswith("postgres") else "SQLite"
    )
    command = f"python -m bench.slurm_peer --pairs {args.pairs} --count {args.count} --latency {args.latency}"
    when = (
        datetime.fromisoformat(args.when)
        if args.when
        else datetime.fromtimestamp(os.path.getmtime(args.again), UTC)
    )
    client = pairs[0]["ours"].get("client", "requests")  # runs before h40client: requests
    command += f" --client {client}" if client != "sdk" else ""
    text = section(pairs, backend=backend, command=command, sched="batch_sched_delay=0", when=when,
                   client=client)  # fmt: skip
    print(text)
    out = args.out or SECTIONS / f"70-slurm-peer-{backend.lower()}.md"
    pathlib.Path(out).write_text(text)
    return 0


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--pairs", type=int, default=5)
    parser.add_argument("--count", type=int, default=1000, help="jobs submitted and drained")
    parser.add_argument("--latency", type=int, default=10, help="latency samples a pair")
    parser.add_argument("--out", help="default: docs/bench/70-slurm-peer-<backend>.md")
    parser.add_argument("--again", metavar="LOG", help="write the section again from a run's "
                        "printed PAIR lines (docs/bench/70-slurm-peer-*.jsonl keeps them); give "
                        "the run's --pairs/--count/--latency")  # fmt: skip
    parser.add_argument(
        "--when", help="with --again: the run's UTC time (ISO), default the LOG's mtime"
    )
    parser.add_argument("--unfenced", action="store_true", help="our agents with "
                        "GPUPLATFORM_ISOLATION=none: what the fence costs (not the headline)")  # fmt: skip
    parser.add_argument("--client", choices=sorted(CLIENT_KINDS), default="sdk", help="our 8 "
                        "clients: the SDK's Client (default) or a requests.Session a thread")  # fmt: skip
    args = parser.parse_args()
    if args.again:
        return again(args)
    if args.unfenced:
        os.environ["GPUPLATFORM_ISOLATION"] = "none"  # the platform's processes inherit it
    if shutil.which("sbatch") is None or not (LAB / "etc" / "slurm.conf").exists():
        print(
            "bench.slurm_peer: no Slurm lab: run `SCHED_PARAMS=batch_sched_delay=0 bash "
            "../shared/peers/slurm/setup.sh` first",
            file=sys.stderr,
        )
        return 2
    backend = (
        "PostgreSQL" if os.environ.get("DATABASE_URL", "").startswith("postgres") else "SQLite"
    )
    sched = slurm("scontrol", "show", "config")
    sched = next((x.split("=", 1)[1].strip() for x in sched.splitlines()
                  if x.startswith("SchedulerParameters")), "?")  # fmt: skip
    pairs = []
    for number in range(1, args.pairs + 1):
        load = os.getloadavg()[0]
        with tempfile.TemporaryDirectory(prefix="gpuplatform-peer-") as tmp:
            mine = ours(args.count, args.latency, pathlib.Path(tmp), args.client)
            peer = theirs(args.count, args.latency, pathlib.Path(tmp) / "slurm")
        pair = {"pair": number, "load": round(load, 1), "ours": mine, "slurm": peer}
        pairs.append(pair)
        print("PAIR " + json.dumps(pair), flush=True)
        print(f"pair {number}: the clients' CPU a submit, ours ({args.client}) "
              f"{mine['client_cpu_ms_per_submit']:.2f} ms, Slurm's (sbatch) "
              f"{peer['client_cpu_ms_per_submit']:.2f} ms", flush=True)  # fmt: skip
    command = f"python -m bench.slurm_peer --pairs {args.pairs} --count {args.count} --latency {args.latency}"
    command += " --unfenced" if args.unfenced else ""
    command += f" --client {args.client}" if args.client != "sdk" else ""
    text = section(pairs, backend=backend, command=command, sched=sched, when=datetime.now(UTC),
                   unfenced=args.unfenced, client=args.client)  # fmt: skip
    print(text)
    out = args.out or SECTIONS / f"70-slurm-peer-{backend.lower()}.md"
    pathlib.Path(out).write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
