"""Submit to first instruction on an idle cluster, hop by hop (issue 35's start latency).

    python -m bench.start_latency [--samples 20] [--gap 0.5]

A whole platform as bench.slurm_peer makes it (4 nodes x 4 fake GPUs, fenced agents where the
machine allows), then `samples` one-GPU `date +%s.%N` jobs submitted one at a time, `gap`
seconds after the previous one ended. For each: the client's clock just before its POST, the
job's `created_at` (its commit), the attempt's `placed_at` (the dispatcher's placement), the
job's own first clock reading (its log) and the attempt's `started_at` (the agent's report).
Prints each sample and the p50 of every hop. SQLite unless DATABASE_URL names PostgreSQL. Not
part of `make bench` (bench.slurm_peer's latency is the figure; this one says where it goes).
"""

from __future__ import annotations

import argparse
import pathlib
import statistics
import sys
import tempfile
import time

from bench.foundation import running_platform, ts
from bench.slurm_peer import GPUS, NODES, first_clock

HOPS = (
    ("POST to commit", "posted", "created"),
    ("commit to placed", "created", "placed"),
    ("placed to first instruction", "placed", "first"),
    ("POST to first instruction", "posted", "first"),
)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--samples", type=int, default=20)
    parser.add_argument("--gap", type=float, default=0.5)
    args = parser.parse_args()
    nodes = {f"peer-{i}": ("H100-80GB", GPUS, "") for i in range(NODES)}
    samples = []
    with (
        tempfile.TemporaryDirectory() as tmp,
        running_platform(pathlib.Path(tmp), nodes, "peer") as platform,
    ):
        session = platform.api("bob")
        url = platform.url + "/api/v1/jobs/"
        for i in range(args.samples + 1):
            time.sleep(args.gap)
            posted = time.time()
            answer = session.post(url, json={"command": ["date", "+%s.%N"], "gpus": 1}, timeout=60)
            assert answer.status_code == 201, answer.text
            job = platform.wait_for_state(answer.json()["id"], ["succeeded", "failed"], timeout=60)
            log = session.get(f"{url}{job['id']}/logs/", timeout=30).text
            if i == 0:
                continue  # warm: the first start loads what later ones find loaded
            attempt = job["attempts"][-1]
            sample = {"posted": posted, "created": ts(job["created_at"]),
                      "placed": ts(attempt["placed_at"]), "first": first_clock(log)}  # fmt: skip
            samples.append(sample)
            print(
                "  ".join(f"{name}: {(sample[b] - sample[a]) * 1000:6.1f}" for name, a, b in HOPS)
            )
    print(f"p50 of {len(samples)}:")
    for name, a, b in HOPS:
        print(f"  {name}: {statistics.median((s[b] - s[a]) * 1000 for s in samples):.1f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
