"""Print a fingerprint of the scheduling policy's behaviour, to show a refactor changed nothing.

    python -m scripts.policy_fingerprint > before.txt
    ... change the code ...
    python -m scripts.policy_fingerprint > after.txt && diff before.txt after.txt

It runs the simulator on slices of the public traces (every policy preset, several placement
strategies, gangs, preemption, autoscaling with `preempt_wait_s`, the estimate replay that walks
the policy's own queue order) and a few hundred stateless `decide` calls with `explain=True` on
random small clusters, and prints a SHA-256 per output file (timings dropped) plus every
decision of the stateless calls. Deterministic: seconds, not minutes.
"""

from __future__ import annotations

import hashlib
import io
import json
import random
import sys
import tempfile
from contextlib import redirect_stdout
from pathlib import Path
from typing import Any

from apps.scheduling.core import ClusterManager, Node
from apps.scheduling.core.policy import (
    FAIR_RECLAIM,
    ArrivingNode,
    PolicyConfig,
    QueuedJob,
    RunningJob,
    TenantUsage,
    decide,
    default_tiers,
)
from apps.scheduling.sim.cli import main as sim_main

TIMING_KEYS = {"wall_seconds", "cpu_seconds", "out"}

SIM_RUNS: list[list[str]] = [
    ["--format", "itp", "--trace", "cluster04", "--limit", "1200", "--nodes", "24",
     "--policy", "default,fair-reclaim,fifo,strict,slurm"],
    ["--format", "itp", "--trace", "cluster04", "--limit", "800", "--nodes", "10",
     "--gpus-per-node", "4", "--policy", "default,slurm", "--placement", "fgd-plus"],
    ["--format", "philly", "--limit", "1000", "--nodes", "16", "--policy", "default,strict",
     "--placement", "spread", "--nodes-per-rack", "4"],
    ["--format", "synthetic", "--jobs", "600", "--nodes", "8", "--load", "1.2",
     "--policy", "default,fair-reclaim", "--checkpoint-interval", "0"],
    ["--format", "itp", "--trace", "cluster04", "--limit", "300", "--policy", "default",
     "--autoscale", "reactive,predictive", "--min-nodes", "2", "--max-nodes", "12",
     "--preempt-wait", "600", "--autoscale-interval", "1800"],
    ["--format", "itp", "--trace", "cluster04", "--limit", "400", "--nodes", "12",
     "--policy", "default", "--estimate-error", "5", "--estimate-order", "policy"],
]  # fmt: skip


def _scrub(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _scrub(v) for k, v in value.items() if k not in TIMING_KEYS}
    if isinstance(value, list):
        return [_scrub(v) for v in value]
    return value


def _digest(path: Path) -> str:
    data = path.read_bytes()
    if path.suffix == ".json":
        data = json.dumps(_scrub(json.loads(data)), sort_keys=True).encode()
    return hashlib.sha256(data).hexdigest()[:16]


def sim_fingerprint() -> None:
    for i, argv in enumerate(SIM_RUNS):
        with tempfile.TemporaryDirectory() as tmp:
            with redirect_stdout(io.StringIO()):
                sim_main([*argv, "--out", tmp])
            for path in sorted(Path(tmp).rglob("*")):
                if path.is_file() and path.name != "table.md":  # the table shows CPU seconds
                    print(f"sim{i} {path.relative_to(tmp)} {_digest(path)}")


def _random_state(rng: random.Random, now: float) -> dict[str, Any]:
    tiers = default_tiers()
    names = list(tiers)
    cluster = ClusterManager(rng.choice(["best-fit", "first-fit", "spread", "fgd-plus"]))
    for n in range(rng.randint(2, 6)):
        cluster.add_node(Node(f"n{n}", rng.choice([4, 8]), rng.choice(["A100", "H100"])))
    running = []
    for r in range(rng.randint(0, 8)):
        tier = rng.choice(names)
        gpus, nodes = rng.choice([(1, 1), (2, 1), (4, 1), (2, 2)])
        job_id = f"r{r}"
        placement = cluster.schedule_pod(_pod(job_id, gpus, nodes))
        if placement is None:
            continue
        started = now - rng.uniform(0, 7200)
        running.append(
            RunningJob(
                job_id, f"t{rng.randint(0, 3)}", tier, gpus, started,
                started + rng.uniform(600, 20000), placement, nodes=nodes,
                last_checkpoint_at=rng.choice([None, started + 300.0]),
                restart_cost_s=rng.choice([0.0, 120.0]),
                checkpoint_interval_s=rng.choice([0.0, 900.0]),
                preemptions=rng.randint(0, 3),
            )
        )  # fmt: skip
    queued = [
        QueuedJob(
            f"q{q}", f"t{rng.randint(0, 3)}", rng.choice(names), rng.choice([1, 2, 4, 8]),
            now - rng.uniform(0, 200000), rng.uniform(60, 40000),
            nodes=rng.choice([1, 1, 1, 2, 3]), gpu_models=rng.choice([(), ("A100",), ("H100",)]),
        )
        for q in range(rng.randint(1, 12))
    ]  # fmt: skip
    usage = {f"t{t}": TenantUsage(rng.choice(names), rng.uniform(0, 1e6)) for t in range(4)}
    return {"cluster": cluster, "queued": queued, "running": running, "usage": usage}


def _pod(job_id: str, gpus: int, nodes: int) -> Any:
    from apps.scheduling.core import Pod

    return Pod(job_id, gpus=gpus, nodes=nodes)


CONFIGS = [
    PolicyConfig(),
    PolicyConfig(**FAIR_RECLAIM),
    PolicyConfig(ordering="fifo", backfill=False, preemption=False),
    PolicyConfig(ordering="level-fifo", reservations=2),
    PolicyConfig(ordering="slurm", victim_cost="youngest", grace_s=30.0),
    PolicyConfig(sticky_reservations=False, backfill_depth=3),
]


def decide_fingerprint(calls: int = 300) -> None:
    rng = random.Random(15)
    for call in range(calls):
        now = 1_000_000.0 + call
        state = _random_state(rng, now)
        config = CONFIGS[call % len(CONFIGS)]
        arriving = [ArrivingNode(now + 120.0, "A100", 8)] if call % 5 == 0 else []
        held = [q.job_id for q in state["queued"][:2]] if call % 3 == 0 else None
        out = decide(
            now, state["cluster"], state["queued"], state["running"], default_tiers(),
            state["usage"], config=config, held_reservation=held, arriving=arriving,
            tenant_weights={"t0": 2.0},
        )  # fmt: skip
        for d in out:
            print(f"decide{call} {_decision(d)}")


def _decision(d: Any) -> str:
    placement = getattr(d, "placement", None)
    if placement is not None:
        where = [(a.node, tuple(a.gpu_indices)) for a in placement.assignments]
        return f"{type(d).__name__} {d.job_id} {where} {d.reason}"
    return repr(d)


def main() -> int:
    sim_fingerprint()
    decide_fingerprint()
    return 0


if __name__ == "__main__":
    sys.exit(main())
