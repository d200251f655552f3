"""Submit to first instruction on an idle cluster, hop by hop (issue 35's start latency).

    python -m bench.start_latency [--samples 20] [--gap 0.5]

A whole platform as bench.slurm_peer makes it (4 nodes x 4 fake GPUs, fenced agents where the
machine allows), then `samples` one-GPU `date +%s.%N` jobs submitted one at a time, `gap`
seconds after the previous one ended. For each: the client's clock just before its POST, the
job's `created_at` (its commit), the attempt's `placed_at` (the dispatcher's placement), the
job's own first clock reading (its log) and the attempt's `started_at` (the agent's report).
Prints each sample and the p50 of every hop. SQLite unless DATABASE_URL names PostgreSQL. Not
part of `make bench` (bench.slurm_peer's latency is the figure; this one says where it goes).

The hops between placed and first instruction, and the pass's start, come from the processes'
own log lines (INFO, milliseconds, read after the samples): the dispatcher's "dispatch: placed
1 ..., <seconds>s" less its seconds (the pass's start), the agent's "Task
workers.start_attempts[...] received" (the start message taken) and its "started attempt <id>
rank 0 pid ..." (the fork server's answer: forked, fenced, exec'd). A line not found leaves
that hop out of the sample.
"""

from __future__ import annotations

import argparse
import datetime
import pathlib
import re
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
# From the logs (millisecond stamps): the split of the two middle hops above.
LOG_HOPS = (
    ("commit to the pass's start", "created", "pass"),
    ("the pass's start to placed", "pass", "placed"),
    ("placed to the agent's receipt", "placed", "received"),
    ("receipt to exec'd (fork, fence, exec)", "received", "execd"),
    ("exec'd to first instruction", "execd", "first"),
)
_STAMP = r"^\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}): [A-Z]+/[^]]*\] "
_MOVED = re.compile(_STAMP + r"job (\S+) queued -> starting", re.M)
_PASS = re.compile(_STAMP + r"dispatch: placed \d+, .*, ([\d.]+)s$", re.M)
_RECEIVED = re.compile(_STAMP + r"Task workers\.start_attempts\[\S+\] received$", re.M)
_STARTED = re.compile(_STAMP + r"started attempt (\d+) rank 0 pid", re.M)


def _at(stamp: str) -> float:
    """A log line's time (logging's asctime: local time, milliseconds after the comma)."""
    return datetime.datetime.strptime(stamp, "%Y-%m-%d %H:%M:%S,%f").timestamp()


def log_stamps(platform, job_id: str, placed: float, first: float) -> dict[str, float]:
    """The pass's start, the agent's receipt and its exec'd line for one start (module doc). The
    API shows no attempt's id: the agent's line is the one "started attempt" line between the
    start's placement and its first instruction (one job runs at a time here)."""
    found: dict[str, float] = {}
    dispatcher = platform.logs("dispatcher", tail=200_000)
    moved = next((m for m in _MOVED.finditer(dispatcher) if m.group(2) == job_id), None)
    if moved is not None:
        ended = _PASS.search(dispatcher, moved.end())
        if ended is not None:
            found["pass"] = _at(ended.group(1)) - float(ended.group(2))
    for name in platform.processes:
        if not name.startswith("agent-"):
            continue
        agent = platform.logs(name, tail=200_000)
        started = next((m for m in _STARTED.finditer(agent)
                        if placed - 0.002 <= _at(m.group(1)) <= first + 0.002), None)  # fmt: skip
        if started is None:
            continue
        found["execd"] = _at(started.group(1))
        receipts = [m for m in _RECEIVED.finditer(agent) if m.start() < started.start()]
        if receipts:
            found["received"] = _at(receipts[-1].group(1))
    return found


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
                      "placed": ts(attempt["placed_at"]), "first": first_clock(log),
                      "job": job["id"]}  # fmt: skip
            samples.append(sample)
            print(
                "  ".join(f"{name}: {(sample[b] - sample[a]) * 1000:6.1f}" for name, a, b in HOPS)
            )
        time.sleep(1)  # the last pass's line
        for sample in samples:
            sample.update(
                log_stamps(platform, sample.pop("job"), sample["placed"], sample["first"])
            )
    print(f"p50 of {len(samples)}:")
    for name, a, b in HOPS:
        print(f"  {name}: {statistics.median((s[b] - s[a]) * 1000 for s in samples):.1f} ms")
    print("from the logs (ms stamps; p50 of the samples with both lines):")
    for name, a, b in LOG_HOPS:
        hops = [(s[b] - s[a]) * 1000 for s in samples if a in s and b in s]
        if hops:
            print(f"  {name}: {statistics.median(hops):.1f} ms ({len(hops)})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
