"""A synthetic `user` column for a trace that has none (issue 30's fairness between users).

None of the public traces in ../shared/traces names the user of a job (ITP's raw files have
job_id, submission_time, duration, num_gpu; Philly's flattened file and Alibaba's openb have no
user either). To show the mechanism, `python -m apps.scheduling.sim.users` writes a copy of an
ITP trace with a fifth column `user`, drawn reproducibly: each job goes to one of USERS users
`u00`..`uNN` with a Zipf skew, P(user k) proportional to 1 / k**s (k = 1..USERS), from
`random.Random(seed)`, one draw per job in trace order. So a few users submit most jobs, as in
shared clusters, and the same arguments give the same file. `--tenants trace` then makes each
user a tenant, its tier drawn by `--tier-mix` (workload.assign_users_as_tenants).

    python -m apps.scheduling.sim.users --trace cluster05 --users 40 --zipf 1.1 --seed 1 --out var/sim/cluster05-users.csv
"""

from __future__ import annotations

import argparse
import csv
import random
import sys
from pathlib import Path

from apps.scheduling.sim.workload import trace_path


def zipf_users(jobs: int, users: int, s: float, seed: int) -> list[str]:
    """One user per job: `u{k:02d}` with P(k) proportional to 1 / k**s, seeded."""
    rng = random.Random(seed)
    names = [f"u{k:02d}" for k in range(1, users + 1)]
    weights = [1.0 / k**s for k in range(1, users + 1)]
    return rng.choices(names, weights, k=jobs)


def with_users(source: Path, out: Path, users: int, s: float, seed: int) -> int:
    """Copy the ITP trace `source` to `out` with a `user` column (see the module doc); returns
    the number of jobs."""
    with source.open(newline="") as f:
        rows = list(csv.DictReader(f))
    fields = ["job_id", "submission_time", "duration", "num_gpu", "user"]
    out.parent.mkdir(parents=True, exist_ok=True)
    with out.open("w", newline="") as f:
        writer = csv.DictWriter(f, fields, extrasaction="ignore")
        writer.writeheader()
        for row, user in zip(rows, zipf_users(len(rows), users, s, seed), strict=True):
            writer.writerow({**row, "user": user})
    return len(rows)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m apps.scheduling.sim.users", description=__doc__)
    p.add_argument("--trace", required=True, help="an ITP cluster (cluster05) or a CSV path")
    p.add_argument("--users", type=int, default=40)
    p.add_argument("--zipf", type=float, default=1.1, help="the skew s: P(user k) ~ 1/k**s")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--out", type=Path, required=True)
    args = p.parse_args(argv)
    if args.users < 1:
        p.error("--users: at least 1")
    n = with_users(trace_path("itp", args.trace), args.out, args.users, args.zipf, args.seed)
    print(f"{n} jobs, {args.users} users (zipf {args.zipf}, seed {args.seed}) -> {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
