"""Command line of the simulator.

    python -m apps.scheduling.sim --format itp --trace cluster04 --nodes 69 --gpus-per-node 8 \
        --tenants 12 --tier-mix enterprise=0.1,pro=0.3,free=0.6 --seed 1 \
        --policy default,fifo,strict,slurm --out var/sim/cluster04

With several policies (comma-separated) each run writes to OUT/<policy>/ and a side-by-side
table is printed (and written to OUT/table.md).

Autoscaling (issue 7; apps/scheduling/sim/autoscale.py):

    python -m apps.scheduling.sim --format itp --trace cluster04 --gpus-per-node 8 \
        --autoscale peak,reactive,predictive --provision-lag 300 --out var/sim/autoscale

`--autoscale` takes one or more of `off` (a static cluster of `--nodes`), `peak` (a static
cluster sized for the workload's peak: the most GPUs its jobs would hold at once if each started
at its submission, in whole nodes), `reactive` and `predictive` (start with `--min-nodes`, grow
up to `--max-nodes`, default the peak, with the core's `Autoscaler` every
`--autoscale-interval` seconds). With several, each run writes to OUT/<mode>/ and the table
compares wait and paid GPU-hours (paid from the moment a node is requested until it is removed
or the last job ends). `--burst-share`/`--momentum-share` size predictive's forecast;
`--preempt-wait S` lets tiers that preempt wait up to S seconds for booting nodes instead.
`--spare-nodes`, `--cancel-booting`, `--unwanted-cooldown`, `--decide-on-arrival` and
`--oracle-lookahead` (analysis only) are described in docs/autoscaling.md.

`--estimate-error [EVERY]` measures the error of the API's `estimated_start_at` at every
EVERY-th arrival (apps/scheduling/sim/estimate.py): summary.json's `estimate_error`, and a table.
"""

from __future__ import annotations

import argparse
import math
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from apps.scheduling.sim.autoscale import AutoscaleHook, AutoscaleSettings
from apps.scheduling.sim.engine import SimSettings, Simulation
from apps.scheduling.sim.estimate import EstimateErrorHook, error_table
from apps.scheduling.sim.plan_error import PlanErrorHook, plan_table
from apps.scheduling.sim.presets import POLICIES, policy_preset
from apps.scheduling.sim.report import summarize, targets_table, write_outputs
from apps.scheduling.sim.workload import (
    assign_tenants,
    assign_users_as_tenants,
    fit_to_nodes,
    offered_load,
    parse_mix,
    read_itp,
    read_philly,
    synthetic,
    trace_path,
)


def tenants_arg(text: str) -> int | str:
    if text == "trace":
        return text
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError("a number of tenants, or `trace`") from None


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
    p.add_argument(
        "--tenants",
        type=tenants_arg,
        default=12,
        help="how many tenants to draw, or `trace`: each user of the trace is one",
    )
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
    p.add_argument("--autoscale", default="off", help=f"one or more of {','.join(AUTOSCALE_MODES)}")
    p.add_argument("--provision-lag", type=float, default=300.0, help="seconds a new node takes")
    p.add_argument("--min-nodes", type=int, default=0, help="autoscaled: nodes at the start")
    p.add_argument("--max-nodes", type=int, default=0, help="autoscaled: at most (0: the peak)")
    p.add_argument("--cooldown", type=float, default=600.0, help="seconds idle before removal")
    p.add_argument("--autoscale-interval", type=float, default=60.0, help="seconds between calls")
    p.add_argument(
        "--burst-share", type=float, default=0.0,
        help="predictive: keep room for this share of the recent burst (0: the smoothed rate only)",
    )  # fmt: skip
    p.add_argument(
        "--momentum-share", type=float, default=0.0,
        help="predictive: keep room for this share of the last minutes' arrival pace over the lag",
    )  # fmt: skip
    p.add_argument("--spare-nodes", type=int, default=0, help="predictive: whole nodes kept free")
    p.add_argument(
        "--cancel-booting", action="store_true",
        help="give back booting nodes nothing wants any more (billed until the cancel)",
    )  # fmt: skip
    p.add_argument(
        "--unwanted-cooldown", type=float, default=None,
        help="autoscaled: idle nodes the target does not want go after this long (default: cooldown)",
    )  # fmt: skip
    p.add_argument(
        "--oracle-lookahead", type=float, default=0.0,
        help="analysis only: the autoscaler sees jobs due within this many seconds (clairvoyant)",
    )  # fmt: skip
    p.add_argument(
        "--decide-on-arrival", action="store_true",
        help="autoscaled: also decide right after a pass that saw arrivals",
    )  # fmt: skip
    p.add_argument(
        "--preempt-wait", type=float, default=0.0,
        help="tiers that preempt wait this long for booting nodes instead (TierPolicy.preempt_wait_s)",
    )  # fmt: skip
    p.add_argument(
        "--estimate-error", nargs="?", const=1, type=int, metavar="EVERY",
        help="measure estimated_start_at's error at every EVERY-th arrival (default 1: all)",
    )  # fmt: skip
    p.add_argument(
        "--plan-error", nargs="?", const=1, type=int, metavar="EVERY",
        help="score the platform's plan estimate (apps/scheduling/plan.py) at every EVERY-th arrival",
    )  # fmt: skip
    p.add_argument(
        "--plan-arrivals", type=float, default=0.0, metavar="SECONDS",
        help="the scored plan expects the last SECONDS' arrivals to come again (0: none)",
    )  # fmt: skip
    p.add_argument(
        "--plan-calibration", choices=("on", "off"), default="on",
        help="the scored estimate corrected by the plan's past errors (core/calibrate.py)",
    )  # fmt: skip
    p.add_argument(
        "--plan-rescore", type=float, default=0.0, metavar="SECONDS",
        help="also re-plan every waiting job every SECONDS of simulated time and score those",
    )  # fmt: skip
    p.add_argument(
        "--plan-oracle",
        action="store_true",
        help="the scored plan knows the true length of every job present (a bound: only the "
        "arrivals it cannot see are left)",
    )
    p.add_argument(
        "--plan-dump",
        type=Path,
        default=None,
        metavar="PATH",
        help="write what was known at each scored arrival, and each job's start, as JSON lines",
    )
    p.add_argument(
        "--plan-events", type=int, default=80, metavar="N",
        help="policy passes per scored forecast (the dispatcher's plan: 80)",
    )  # fmt: skip
    p.add_argument(
        "--estimate-order", choices=("platform", "policy"), default="platform",
        help="queue order the estimate replays (platform: queue_position's; policy: the scheduler's)",
    )  # fmt: skip
    return p


AUTOSCALE_MODES = ("off", "peak", "reactive", "predictive")


def peak_nodes(jobs: list, gpus_per_node: int) -> int:
    """Nodes for the most GPUs the jobs would hold at once if each started at its submission
    (no waiting, whole nodes per job shape: a gang of k members x g GPUs counts k x g)."""
    steps = sorted(
        [(j.submit, j.gpus * j.nodes) for j in jobs]
        + [(j.submit + j.duration, -j.gpus * j.nodes) for j in jobs],
        key=lambda e: (e[0], e[1]),
    )
    held = peak = 0
    for _, delta in steps:
        held += delta
        peak = max(peak, held)
    return math.ceil(peak / gpus_per_node)


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
    if args.tenants == "trace":
        assign_users_as_tenants(jobs, parse_mix(args.tier_mix), args.seed)
    else:
        assign_tenants(jobs, parse_mix(args.tier_mix), args.tenants, args.seed)
    fit_to_nodes(jobs, args.gpus_per_node)
    return jobs, source


def run_one(args: argparse.Namespace, policy: str, out: Path, mode: str = "off") -> dict[str, Any]:
    jobs, source = load_workload(args)
    tiers, config = policy_preset(policy, grace_s=args.grace, depth=args.backfill_depth)
    if args.preempt_wait > 0:
        tiers = {
            k: replace(t, preempt_wait_s=args.preempt_wait) if t.can_preempt else t
            for k, t in tiers.items()
        }
    peak = peak_nodes(jobs, args.gpus_per_node)
    nodes = {"off": args.nodes, "peak": peak}.get(mode, args.min_nodes)
    settings = SimSettings(
        nodes=nodes, gpus_per_node=args.gpus_per_node,
        checkpoint_interval_s=args.checkpoint_interval, restart_overhead_s=args.restart_overhead,
        grace_s=args.grace, strategy=args.placement, nodes_per_rack=args.nodes_per_rack,
    )  # fmt: skip
    sim = Simulation(jobs, settings, tiers, config)
    hook = None
    if mode in ("reactive", "predictive"):
        hook = AutoscaleHook(
            AutoscaleSettings(
                mode, provision_lag_s=args.provision_lag, min_nodes=args.min_nodes,
                max_nodes=args.max_nodes or peak, cooldown_s=args.cooldown,
                interval_s=args.autoscale_interval, burst_share=args.burst_share,
                momentum_share=args.momentum_share,
                spare_nodes=args.spare_nodes, cancel_booting=args.cancel_booting,
                decide_on_arrival=args.decide_on_arrival,
                unwanted_cooldown_s=args.unwanted_cooldown,
                oracle_lookahead_s=args.oracle_lookahead,
            ),
            args.gpus_per_node, settings.gpu_model,
        )  # fmt: skip
        hook.install(sim)
    estimate = None
    if args.estimate_error:
        estimate = EstimateErrorHook(args.estimate_error, args.estimate_order)
        estimate.install(sim)
    planned = None
    if args.plan_error:
        planned = PlanErrorHook(args.plan_error, max_events=args.plan_events,
                                calibrate=args.plan_calibration == "on",
                                arrival_window_s=args.plan_arrivals,
                                rescore_s=args.plan_rescore,
                                oracle=args.plan_oracle,
                                dump=[] if args.plan_dump else None)  # fmt: skip
        planned.install(sim)
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
    last_end = max((j.end for j in jobs if j.end is not None), default=sim.end_t)
    scaling = hook.summary() if hook else {"mode": mode, "peak_nodes": nodes}
    scaling.update(
        workload_peak_nodes=peak,
        paid_gpu_hours=sim.paid_gpu_hours(last_end),
        billed_until=last_end,
        billing="each node from its request (booting included) to its removal or the last job end",
    )
    summary["autoscale"] = scaling
    summary["paid_gpu_hours"] = scaling["paid_gpu_hours"]
    if estimate is not None:
        summary["estimate_error"] = estimate.summary()
    if planned is not None:
        summary["plan_error"] = planned.summary()
        if args.plan_dump:
            _write_plan_dump(args.plan_dump, planned, jobs)
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
    return "\n".join(_grid("figure", rows, results)) + "\n"


def _grid(corner: str, rows: list, results: dict[str, dict[str, Any]]) -> list[str]:
    """Markdown lines: one column per run in `results`, one row per (label, getter)."""
    names = list(results)
    lines = [f"| {corner} | " + " | ".join(names) + " |", "|---" * (len(names) + 1) + "|"]
    for label, get in rows:
        lines.append(f"| {label} | " + " | ".join(get(results[n]) for n in names) + " |")
    return lines


def _h(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds / 3600:.2f}"


def _m(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds / 60:.2f}"


def _f(x: float | None) -> str:
    return "-" if x is None else f"{x:.3f}"


def autoscale_table(results: dict[str, dict[str, Any]]) -> str:
    """Wait and what it cost: p50/p95 wait, paid GPU-hours, node counts."""
    rows = [
        ("p50 wait (min)", lambda s: _m(s["by_size"]["all"]["wait_p50"])),
        ("p95 wait (min)", lambda s: _m(s["by_size"]["all"]["wait_p95"])),
        ("p99 wait (min)", lambda s: _m(s["by_size"]["all"]["wait_p99"])),
        ("mean wait (min)", lambda s: _m(s["by_size"]["all"]["wait_mean"])),
        ("paid GPU-hours", lambda s: f"{s['paid_gpu_hours']:,.0f}"),
        ("GPU-hours delivered", lambda s: f"{s['gpu_hours_delivered']:,.0f}"),
        ("nodes at most (up + booting)", lambda s: str(s["autoscale"]["peak_nodes"])),
        ("nodes provisioned / removed", lambda s: f"{s['autoscale'].get('nodes_provisioned', 0)} / {s['autoscale'].get('nodes_terminated', 0) + s['autoscale'].get('nodes_drained', 0)}"),
        ("preemptions", lambda s: str(s["preemptions"])),
        ("simulation CPU time (s)", lambda s: f"{s['cpu_seconds']:.1f}"),
    ]  # fmt: skip
    lines = _grid("autoscale", rows, results)
    checks = autoscale_targets(results)
    if checks:
        lines += ["", "| target (issue 7) | measured | met |", "|---|---|---|"]
        lines += [f"| {a} | {b} | {'yes' if c else 'no'} |" for a, b, c in checks]
    return "\n".join(lines) + "\n"


def autoscale_targets(results: dict[str, dict[str, Any]]) -> list[tuple[str, str, bool]]:
    """Issue 7: predictive vs reactive (no more paid GPU-hours, p95 wait >= 30% lower) and vs
    the static cluster sized for the peak (<= 60% of its GPU-hours, p95 wait <= 1.5x)."""
    pred = results.get("predictive")
    if pred is None:
        return []

    def p95(r: dict[str, Any]) -> float:
        return r["by_size"]["all"]["wait_p95"] or 0.0

    out = []
    react = results.get("reactive")
    if react is not None:
        a, b = pred["paid_gpu_hours"], react["paid_gpu_hours"]
        out.append(("paid GPU-hours: predictive <= reactive", f"{a:,.0f} vs {b:,.0f}", a <= b))
        a, b = p95(pred), p95(react)
        cut = 1 - a / b if b else 0.0
        out.append((
            "p95 wait: predictive >= 30% below reactive",
            f"{a / 60:.2f} vs {b / 60:.2f} min ({100 * cut:.0f}% lower)", b > 0 and cut >= 0.3,
        ))  # fmt: skip
    peak = results.get("peak")
    if peak is not None:
        a, b = pred["paid_gpu_hours"], peak["paid_gpu_hours"]
        out.append((
            "paid GPU-hours: predictive <= 60% of static-for-peak",
            f"{a:,.0f} vs {b:,.0f} ({100 * a / b:.0f}%)", a <= 0.6 * b,
        ))  # fmt: skip
        a, b = p95(pred), p95(peak)
        out.append((
            "p95 wait: predictive <= 1.5x static-for-peak",
            f"{a / 60:.2f} vs {b / 60:.2f} min", a <= 1.5 * b,
        ))  # fmt: skip
    return out


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    policies = [p.strip() for p in args.policy.split(",") if p.strip()]
    for p in policies:
        policy_preset(p)  # fail early on a bad name
    modes = [m.strip() for m in args.autoscale.split(",") if m.strip()]
    for m in modes:
        if m not in AUTOSCALE_MODES:
            raise SystemExit(f"unknown --autoscale {m!r}; choose from {', '.join(AUTOSCALE_MODES)}")
    if len(policies) > 1 and len(modes) > 1:
        raise SystemExit("compare several policies or several --autoscale modes, not both")
    runs = (
        [(p, modes[0], p) for p in policies]
        if len(modes) == 1
        else [(policies[0], m, m) for m in modes]
    )
    results = {}
    for policy, mode, key in runs:
        out = args.out / key if len(runs) > 1 else args.out
        results[key] = run_one(args, policy, out, mode)
        s = results[key]
        print(
            f"{key}: {s['finished']}/{s['jobs']} jobs finished in {s['wall_seconds']:.1f} s -> {out}",
            flush=True,
        )
    text = table(results)
    checks = targets_table(results) if len(modes) == 1 else ""
    if checks and "fair-reclaim" in results:
        checks += "\n" + targets_table(results, "fair-reclaim")
    if checks:
        text += "\n" + checks
    text += "\n" + autoscale_table(results)
    for key, s in results.items():
        if "estimate_error" in s:
            text += f"\n{key}: " + error_table(s["estimate_error"])
        if "plan_error" in s:
            text += f"\n{key}: " + plan_table(s["plan_error"])
    print(text)
    if len(runs) > 1:
        (args.out / "table.md").write_text(text)
    return 0


def _write_plan_dump(path: Path, planned: PlanErrorHook, jobs: list) -> None:
    """Each scored arrival's known state, then each job's outcome, as JSON lines."""
    import json

    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w") as out:
        for row in planned.dump or []:
            out.write(json.dumps({"kind": "arrival", **row}) + "\n")
        for job in jobs:
            out.write(json.dumps({"kind": "job", "job": job.job_id, "tier": job.tier,
                                  "submit": job.submit, "start": job.start, "end": job.end,
                                  "gpus": job.gpus * max(job.nodes, 1)}) + "\n")  # fmt: skip
