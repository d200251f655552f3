"""Workloads for the simulator: the public traces, a synthetic generator, and tenant assignment.

Traces live in `../shared/traces` beside the repository (override with `GPUPLATFORM_TRACES`).
They carry no tenants, so `assign_tenants` gives each job a tenant and tier by a seeded rule:

1. Tenants per tier: `round(mix[tier] * tenants)` by largest remainder, at least one per tier
   with a non-zero share; tenant names are `<tier>-<k>`.
2. Each job, in trace order, draws its tier with probability `mix[tier]` and then a tenant of
   that tier with probability proportional to 1/(k+1) (Zipf, s=1): tenant 0 of each tier submits
   the most, so every tier has a flooding tenant and some light ones.
The draws come from `random.Random(seed)`, so the same seed gives the same assignment.
"""

from __future__ import annotations

import csv
import math
import os
import random
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]


@dataclass(slots=True)
class SimJob:
    """One job of the workload and what happened to it."""

    job_id: str
    submit: float
    duration: float  # work, in seconds, at its full size
    gpus_total: int  # as the trace asks
    tenant: str = ""
    tier: str = ""
    gpus: int = 0  # per node, after fitting the trace's size to the cluster's nodes
    nodes: int = 0
    # outcome
    start: float | None = None  # first start
    end: float | None = None
    done: float = 0.0  # work saved so far (checkpointed or finished)
    preemptions: int = 0
    lost_s: float = 0.0  # wall seconds of running that produced no kept work
    segments: list[tuple[float, float, str, str]] = field(default_factory=list)
    attempt: int = 0  # bumps on every (re)start so stale finish events are ignored
    seg_start: float = 0.0
    seg_progress_from: float = 0.0
    seg_nodes: str = ""
    user: str = ""  # the trace's `user` column, where it has one (API.md "Simulator"); last, so
    # the positional fields above keep their places


def traces_dir() -> Path:
    env = os.environ.get("GPUPLATFORM_TRACES")
    return Path(env) if env else REPO.parent / "shared" / "traces"


def trace_path(fmt: str, trace: str | None) -> Path:
    """`trace` may be a path, or for itp a cluster name such as `cluster04`."""
    if trace and Path(trace).exists():
        return Path(trace)
    base = traces_dir()
    if fmt == "itp":
        name = trace or "cluster04"
        return (
            base
            / "msr-itp-elasticflow"
            / "raw"
            / (name if name.endswith(".csv") else f"{name}.csv")
        )
    if fmt == "philly":
        return base / "philly-rfold" / (trace or "philly_trace.csv")
    raise ValueError(f"no trace file for format {fmt!r}")


def read_itp(path: Path, limit: int | None = None) -> list[SimJob]:
    """msr-itp-elasticflow raw/clusterNN.csv: job_id, submission_time, duration, num_gpu, and
    an optional fifth column `user` (API.md "Simulator")."""
    jobs = []
    with open(path, newline="") as fh:
        for row in csv.DictReader(fh):
            jobs.append(
                SimJob(
                    row["job_id"],
                    float(row["submission_time"]),
                    float(row["duration"]),
                    int(row["num_gpu"]),
                    user=(row.get("user") or "").strip(),
                )
            )
            if limit and len(jobs) >= limit:
                break
    return _from_zero(jobs)


def read_philly(path: Path, limit: int | None = None) -> list[SimJob]:
    """philly-rfold: `#job id, arrival time (sec), topology, shape, size, duration (sec)`."""
    jobs = []
    with open(path, newline="") as fh:
        for row in csv.reader(fh):
            if not row or row[0].startswith("#"):
                continue
            jobs.append(SimJob(f"p{row[0]}", float(row[1]), float(row[5]), int(row[4])))
            if limit and len(jobs) >= limit:
                break
    return _from_zero(jobs)


def synthetic(jobs: int, gpus: int, load: float, seed: int) -> list[SimJob]:
    """Poisson arrivals, log-normal durations (median 30 min), sizes like the ITP traces,
    with the arrival rate set so the offered load on `gpus` GPUs is `load`."""
    rng = random.Random(seed)
    sizes, weights = (1, 2, 4, 8, 16, 32), (70, 5, 8, 12, 3, 2)
    raw = []
    for i in range(jobs):
        size = rng.choices(sizes, weights)[0]
        duration = max(60.0, rng.lognormvariate(math.log(1800), 1.2))
        raw.append((size, duration, i))
    work = sum(size * duration for size, duration, _ in raw)
    rate = load * gpus * jobs / work  # jobs per second
    t = 0.0
    out = []
    for size, duration, i in raw:
        t += rng.expovariate(rate)
        out.append(SimJob(f"s{i}", round(t, 3), round(duration, 3), size))
    return out


def _from_zero(jobs: list[SimJob]) -> list[SimJob]:
    jobs.sort(key=lambda j: j.submit)
    if jobs:
        t0 = jobs[0].submit
        for job in jobs:
            job.submit -= t0
    return jobs


def parse_mix(text: str) -> dict[str, float]:
    mix = {}
    for part in text.split(","):
        name, _, share = part.partition("=")
        mix[name.strip()] = float(share)
    total = sum(mix.values())
    if total <= 0:
        raise ValueError(f"tier mix {text!r} sums to {total}")
    return {name: share / total for name, share in mix.items()}


def tenants_per_tier(mix: dict[str, float], tenants: int) -> dict[str, list[str]]:
    """Largest-remainder split of `tenants` over the tiers, at least one per tier."""
    exact = {tier: share * tenants for tier, share in mix.items() if share > 0}
    counts = {tier: max(1, int(v)) for tier, v in exact.items()}
    by_remainder = sorted(exact, key=lambda t: exact[t] - int(exact[t]), reverse=True)
    i = 0
    while sum(counts.values()) < tenants and by_remainder:
        counts[by_remainder[i % len(by_remainder)]] += 1
        i += 1
    return {tier: [f"{tier}-{k}" for k in range(n)] for tier, n in counts.items()}


def assign_tenants(jobs: list[SimJob], mix: dict[str, float], tenants: int, seed: int) -> None:
    """Give every job a tenant and tier by the seeded rule in the module docstring."""
    rng = random.Random(seed)
    groups = tenants_per_tier(mix, tenants)
    tiers = list(groups)
    tier_weights = [mix[t] for t in tiers]
    zipf = {t: [1.0 / (k + 1) for k in range(len(names))] for t, names in groups.items()}
    for job in jobs:
        tier = rng.choices(tiers, tier_weights)[0]
        job.tier = tier
        job.tenant = rng.choices(groups[tier], zipf[tier])[0]


def assign_users_as_tenants(jobs: list[SimJob], mix: dict[str, float], seed: int) -> None:
    """`--tenants trace`: every distinct user of the trace is a tenant (a job without one is the
    user "unknown"), its tier drawn by `mix` with `random.Random(seed)`, users taken in the order
    they first submit, so the same seed gives the same tiers."""
    rng = random.Random(seed)
    tiers = [tier for tier, share in mix.items() if share > 0]
    weights = [mix[tier] for tier in tiers]
    tier_of: dict[str, str] = {}
    for job in jobs:
        user = job.user or "unknown"
        if user not in tier_of:
            tier_of[user] = rng.choices(tiers, weights)[0]
        job.tenant, job.tier = user, tier_of[user]


def fit_to_nodes(jobs: list[SimJob], gpus_per_node: int) -> None:
    """A job of n GPUs becomes one node of n GPUs, or ceil(n/G) nodes of ceil(n/nodes) GPUs (a gang)."""
    for job in jobs:
        n = max(1, job.gpus_total)
        nodes = math.ceil(n / gpus_per_node)
        job.nodes = nodes
        job.gpus = math.ceil(n / nodes)


def offered_load(jobs: list[SimJob], gpus: int) -> float:
    span = jobs[-1].submit - jobs[0].submit if len(jobs) > 1 else 1.0
    return sum(j.duration * j.gpus_total for j in jobs) / max(span, 1.0) / gpus
