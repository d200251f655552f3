"""Command line of the simulator.

    python -m apps.scheduling.sim --format itp --trace cluster04 --nodes 69 --gpus-per-node 8 \
        --tenants 12 --tier-mix enterprise=0.1,pro=0.3,free=0.6 --seed 1 \
        --policy default,fifo,strict,slurm --out var/sim/cluster04

With several policies (comma-separated) each run writes to OUT/<policy>/ and a side-by-side
table is printed (and written to OUT/table.md).
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Any

from apps.scheduling.sim.engine import SimSettings, Simulation
from apps.scheduling.sim.presets import POLICIES, policy_preset
from apps.scheduling.sim.report import summarize, targets_table, write_outputs
from apps.scheduling.sim.workload import (
    assign_tenants,
    fit_to_nodes,
    offered_load,
    parse_mix,
    read_itp,
    read_philly,
    synthetic,
    trace_path,
)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m apps.scheduling.sim", description=__doc__.split("\n")[0]
    )
    p.add_argument("--format", choices=("itp", "philly", "synthetic"), default="itp")
    p.add_argument("--trace", help="itp cluster name (cluster04) or a CSV path")
    p.add_argument("--limit", type=int, help="only the first N jobs of the trace")
    p.add_argument("--jobs", type=int, default=2000, help="synthetic: number of jobs")
    p.add_argument("--load", type=float, default=0.9, help="synthetic: offered load")
    p.add_argument("--nodes", type=int, default=16)
    p.add_argument("--gpus-per-node", type=int, default=8)
    p.add_argument("--nodes-per-rack", type=int, default=0, help="label nodes with racks/zones")
    p.add_argument("--tenants", type=int, default=12)
    p.add_argument("--tier-mix", default="enterprise=0.1,pro=0.3,free=0.6")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--policy", default="default", help=f"one or more of {','.join(POLICIES)}")
    p.add_argument(
        "--placement", default="best-fit", help="placement strategy of the ClusterManager"
    )
    p.add_argument("--checkpoint-interval", type=float, default=1800.0, help="seconds; 0 = never")
    p.add_argument("--restart-overhead", type=float, default=300.0, help="seconds")
    p.add_argument("--grace", type=float, default=30.0, help="seconds a victim gets to exit")
    p.add_argument("--backfill-depth", type=int, default=256)
    p.add_argument("--out", type=Path, default=Path("var/sim"))
    p.add_argument("--no-files", action="store_true", help="skip jobs.csv/segments.csv")
    return p


def load_workload(args: argparse.Namespace) -> tuple[list, str]:
    gpus = args.nodes * args.gpus_per_node
    if args.format == "synthetic":
        jobs = synthetic(args.jobs, gpus, args.load, args.seed)
        source = f"synthetic({args.jobs} jobs, load {args.load})"
    else:
        path = trace_path(args.format, args.trace)
        reader = read_itp if args.format == "itp" else read_philly
        jobs = reader(path, args.limit)
        source = str(path)
    assign_tenants(jobs, parse_mix(args.tier_mix), args.tenants, args.seed)
    fit_to_nodes(jobs, args.gpus_per_node)
    return jobs, source


def run_one(args: argparse.Namespace, policy: str, out: Path) -> dict[str, Any]:
    jobs, source = load_workload(args)
    tiers, config = policy_preset(policy, grace_s=args.grace, depth=args.backfill_depth)
    settings = SimSettings(
        nodes=args.nodes, gpus_per_node=args.gpus_per_node,
        checkpoint_interval_s=args.checkpoint_interval, restart_overhead_s=args.restart_overhead,
        grace_s=args.grace, strategy=args.placement, nodes_per_rack=args.nodes_per_rack,
    )  # fmt: skip
    sim = Simulation(jobs, settings, tiers, config)
    began, cpu = time.perf_counter(), time.process_time()
    sim.run()
    elapsed, cpu = time.perf_counter() - began, time.process_time() - cpu
    used = {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()}
    used.update(
        policy=policy, source=source, offered_load=offered_load(jobs, args.nodes * args.gpus_per_node),
        tiers={k: _tier_dict(t) for k, t in tiers.items()}, config=_tier_dict(config),
    )  # fmt: skip
    summary = summarize(sim, used, elapsed)
    summary["cpu_seconds"] = cpu
    if args.no_files:
        out.mkdir(parents=True, exist_ok=True)
        (out / "summary.json").write_text(
            __import__("json").dumps(summary, indent=2, sort_keys=True)
        )
    else:
        write_outputs(sim, out, summary)
    return summary


def _tier_dict(obj: Any) -> dict[str, Any]:
    return {f: getattr(obj, f) for f in obj.__dataclass_fields__}


def table(results: dict[str, dict[str, Any]]) -> str:
    """Side by side: the figures issue 4 sets targets on."""
    rows = [
        ("enterprise p99 wait (min)", lambda s: _m(s["tiers"].get("enterprise", {}).get("wait_p99"))),
        ("pro p99 wait (h)", lambda s: _h(s["tiers"].get("pro", {}).get("wait_p99"))),
        ("free p99 wait (h)", lambda s: _h(s["tiers"].get("free", {}).get("wait_p99"))),
        ("free max wait (h)", lambda s: _h(s["tiers"].get("free", {}).get("wait_max"))),
        ("jobs >= 32 GPUs p99 wait (h)", lambda s: _h(s["by_size"]["gpus>=32"]["wait_p99"])),
        ("mean JCT (h)", lambda s: _h(s["by_size"]["all"]["jct_mean"])),
        ("mean wait (h)", lambda s: _h(s["by_size"]["all"]["wait_mean"])),
        ("utilisation while jobs wait", lambda s: _f(s["utilisation_while_waiting"])),
        ("Jain enterprise / pro / free", lambda s: " / ".join(_f(s["tiers"].get(t, {}).get("jain_fairness")) for t in ("enterprise", "pro", "free"))),
        ("preemptions", lambda s: str(s["preemptions"])),
        ("GPU-h lost / delivered", lambda s: f"{s['gpu_hours_lost']:.0f} / {s['gpu_hours_delivered']:.0f} ({100 * s['lost_share']:.2f}%)"),
        ("jobs over aging bound", lambda s: str(sum(a["jobs_over_bound"] for a in s["aging"].values()))),
        ("simulation CPU time (s)", lambda s: f"{s['cpu_seconds']:.1f}"),
    ]  # fmt: skip
    names = list(results)
    lines = ["| figure | " + " | ".join(names) + " |", "|---" * (len(names) + 1) + "|"]
    for label, get in rows:
        lines.append(f"| {label} | " + " | ".join(get(results[n]) for n in names) + " |")
    return "\n".join(lines) + "\n"


def _h(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds / 3600:.2f}"


def _m(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds / 60:.2f}"


def _f(x: float | None) -> str:
    return "-" if x is None else f"{x:.3f}"


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    policies = [p.strip() for p in args.policy.split(",") if p.strip()]
    for p in policies:
        policy_preset(p)  # fail early on a bad name
    results = {}
    for policy in policies:
        out = args.out / policy if len(policies) > 1 else args.out
        results[policy] = run_one(args, policy, out)
        s = results[policy]
        print(
            f"{policy}: {s['finished']}/{s['jobs']} jobs finished in {s['wall_seconds']:.1f} s -> {out}",
            flush=True,
        )
    text = table(results)
    checks = targets_table(results)
    if checks:
        text += "\n" + checks
    print(text)
    if len(policies) > 1:
        (args.out / "table.md").write_text(text)
    return 0
