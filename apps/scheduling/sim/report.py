"""What a simulation writes: jobs.csv, segments.csv and summary.json (figures defined here).

- wait = first start - submit; JCT = end - submit; percentiles interpolate linearly.
- utilisation while jobs wait = allocated GPU-seconds / cluster GPU-seconds, over the time
  during which at least one job was queued.
- Jain's fairness per tier: every `sample_s`, the tier's allocated GPUs are split max-min fairly
  over its tenants by their demand (running + queued GPUs); x_i = a tenant's allocated GPU-time /
  its fair GPU-time, over the samples in which some tenant of the tier waited;
  J = (sum x)^2 / (n sum x^2). 1.0 means every tenant got its fair share.
- the aging bound of tier T: age_limit(T) + R, R the longest runtime estimate in the workload
  (see docs/scheduling.md for when it holds); under the `fair` order with aging capped at the
  share (`default`, `fair-reclaim`), `aging_above_share` x age_limit(T) + 2 R (the overdue job
  may wait for the reservation ahead of it); jobs over it are listed, with how many jobs aged
  and the longest wait past the age limit.
- GPU-hours lost = GPUs x lost seconds (work since the last checkpoint, grace, restarts).
- paid GPU-hours (summary["paid_gpu_hours"], with autoscaling details under "autoscale"): every
  node from the moment it is requested (booting included, as a cloud bills) until it is removed
  or the last job ends, x its GPUs; nodes present at the start count from the first submission.
  nodes.csv lists each node's requested/up/down times.
"""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path
from typing import Any

from apps.scheduling.sim.workload import SimJob


def percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    pos = (len(ordered) - 1) * q / 100.0
    lo = math.floor(pos)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


def jain(values: list[float]) -> float | None:
    if not values:
        return None
    square = sum(v * v for v in values)
    return (sum(values) ** 2) / (len(values) * square) if square > 0 else 1.0


def wait_stats(jobs: list[SimJob]) -> dict[str, Any]:
    waits = [j.start - j.submit for j in jobs if j.start is not None]
    jcts = [j.end - j.submit for j in jobs if j.end is not None]
    return {
        "jobs": len(jobs),
        "unfinished": sum(1 for j in jobs if j.end is None),
        "wait_p50": percentile(waits, 50),
        "wait_p95": percentile(waits, 95),
        "wait_p99": percentile(waits, 99),
        "wait_max": max(waits, default=None),
        "wait_mean": sum(waits) / len(waits) if waits else None,
        "jct_mean": sum(jcts) / len(jcts) if jcts else None,
        "jct_p99": percentile(jcts, 99),
    }


def summarize(sim: Any, settings: dict[str, Any], elapsed_s: float) -> dict[str, Any]:
    jobs: list[SimJob] = sim.jobs
    tiers = sim.scheduler.tiers
    by_tier: dict[str, list[SimJob]] = {}
    for job in jobs:
        by_tier.setdefault(job.tier, []).append(job)
    longest = max((j.duration for j in jobs), default=0.0)
    delivered = sum(j.duration * j.gpus * j.nodes for j in jobs if j.end is not None)
    lost = sum(j.lost_s * j.gpus * j.nodes for j in jobs)
    acc = sim.acc
    summary: dict[str, Any] = {
        "jobs": len(jobs),
        "finished": sum(1 for j in jobs if j.end is not None),
        "tiers": {},
        "by_size": {
            "gpus>=32": wait_stats([j for j in jobs if j.gpus * j.nodes >= 32]),
            "all": wait_stats(jobs),
        },
        "utilisation_while_waiting": acc.busy_while_waiting / acc.total_while_waiting
        if acc.total_while_waiting
        else None,
        "utilisation": acc.busy / acc.capacity if acc.capacity else None,
        "time_with_queue_s": acc.wait_time,
        "preemptions": sum(j.preemptions for j in jobs),
        "preempt_decisions": sim.preempt_decisions,
        "gpu_hours_delivered": delivered / 3600,
        "gpu_hours_lost": lost / 3600,
        "lost_share": lost / delivered if delivered else 0.0,
        "aging": {},
        "settings": settings,
        "wall_seconds": elapsed_s,
    }
    for tier, members in sorted(by_tier.items()):
        stats = wait_stats(members)
        fair = acc.fair.get(tier, {})
        ratios = [a / f for a, f in fair.values() if f > 0]
        stats["jain_fairness"] = jain(ratios)
        stats["tenants"] = len({j.tenant for j in members})
        summary["tiers"][tier] = stats
        policy = tiers.get(tier)
        # Aging capped at the share: a job is sure of its turn once overdue (aging_above_share
        # x A_T), and then after the reservation ahead of it (if any) has started: 2 R.
        config = sim.scheduler.config
        within = config.aging_within_share and config.ordering == "fair"
        scale, runs = (config.aging_above_share, 2) if within else (1.0, 1)
        bound = (policy.age_limit_s * scale + runs * longest) if policy else math.inf
        over = [j.job_id for j in members if j.start is not None and j.start - j.submit > bound]
        over += [j.job_id for j in members if j.start is None]
        limit = policy.age_limit_s if policy else math.inf
        aged = [
            j.start - j.submit - limit
            for j in members
            if j.start is not None and j.start - j.submit > limit
        ]
        summary["aging"][tier] = {
            "age_limit_s": limit if math.isfinite(limit) else None,
            "longest_runtime_s": longest,
            "bound_s": bound if math.isfinite(bound) else None,
            "jobs_over_bound": len(over),
            "examples": over[:10],
            "jobs_aged": len(aged),
            "max_wait_after_aging_s": max(aged, default=None),
        }
    return summary


def write_outputs(sim: Any, out: Path, summary: dict[str, Any]) -> None:
    out.mkdir(parents=True, exist_ok=True)
    with open(out / "jobs.csv", "w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(
            [
                "job_id",
                "tenant",
                "tier",
                "gpus",
                "submit",
                "start",
                "end",
                "duration",
                "preemptions",
                "gpu_seconds_lost",
            ]
        )
        for j in sim.jobs:
            w.writerow([
                j.job_id, j.tenant, j.tier, j.gpus * j.nodes, _num(j.submit), _num(j.start),
                _num(j.end), _num(j.duration), j.preemptions, _num(j.lost_s * j.gpus * j.nodes),
            ])  # fmt: skip
    with open(out / "segments.csv", "w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["job_id", "start", "end", "nodes", "gpus_per_node", "ended_by"])
        for j in sim.jobs:
            for start, end, nodes, how in j.segments:
                w.writerow([j.job_id, _num(start), _num(end), nodes, j.gpus, how])
    with open(out / "nodes.csv", "w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["node", "gpus", "requested", "up", "down"])
        for name, (requested, up, down, gpus) in sorted(sim.billing.items()):
            w.writerow([name, gpus, _num(requested), _num(up), _num(down)])
    (out / "summary.json").write_text(json.dumps(summary, indent=2, sort_keys=True) + "\n")


def _num(x: float | None) -> str:
    if x is None:
        return ""
    return repr(float(x))


def targets(
    results: dict[str, dict[str, Any]], policy: str = "default"
) -> list[tuple[str, str, bool | None]]:
    """Issue 4's targets for `policy` (`default`) against `fifo` and `slurm` in the same run.

    Returns (target, measured, met); met is None when a policy it needs was not run.
    """
    d, f, s = results.get(policy), results.get("fifo"), results.get("slurm")
    if d is None:
        return []

    def tier(r: dict[str, Any], name: str, key: str) -> float | None:
        return r["tiers"].get(name, {}).get(key)

    def big(r: dict[str, Any]) -> float | None:
        return r["by_size"]["gpus>=32"]["wait_p99"]

    out: list[tuple[str, str, bool | None]] = []

    def ratio(label: str, mine: float | None, theirs: float | None, limit: float) -> None:
        if mine is None or theirs is None:
            out.append((label, "-", None))
            return
        value = mine / theirs if theirs else (0.0 if not mine else math.inf)
        out.append(
            (label, f"{mine / 3600:.2f} h vs {theirs / 3600:.2f} h = {value:.2f}x", value <= limit)
        )

    jains = {
        t: v["jain_fairness"] for t, v in d["tiers"].items() if v.get("jain_fairness") is not None
    }
    if f is not None:
        ratio(
            "enterprise p99 wait <= 10% of FIFO's",
            tier(d, "enterprise", "wait_p99"),
            tier(f, "enterprise", "wait_p99"),
            0.10,
        )
        ratio(
            "free p99 wait <= 3x FIFO's",
            tier(d, "free", "wait_p99"),
            tier(f, "free", "wait_p99"),
            3.0,
        )
    over = sum(a["jobs_over_bound"] for a in d["aging"].values())
    out.append(("no job over the aging bound", f"{over} jobs over", over == 0))
    out.append((
        "Jain's fairness >= 0.9 within each tier",
        ", ".join(f"{t} {v:.3f}" for t, v in sorted(jains.items())),
        all(v >= 0.9 for v in jains.values()),
    ))  # fmt: skip
    if f is not None:
        du, fu = d["utilisation_while_waiting"], f["utilisation_while_waiting"]
        out.append(("utilisation while jobs wait >= FIFO's", f"{du:.3f} vs {fu:.3f}", du >= fu))
        ratio("jobs >= 32 GPUs p99 wait <= 2x FIFO's", big(d), big(f), 2.0)
    share = d["lost_share"]
    out.append(
        ("GPU-hours lost to preemption <= 2% of delivered", f"{100 * share:.2f}%", share <= 0.02)
    )
    if f is not None:
        dj, fj = d["by_size"]["all"]["jct_mean"], f["by_size"]["all"]["jct_mean"]
        out.append(("mean JCT <= FIFO's", f"{dj / 3600:.2f} h vs {fj / 3600:.2f} h", dj <= fj))
    if s is not None:
        de, se = tier(d, "enterprise", "wait_p99"), tier(s, "enterprise", "wait_p99")
        assert de is not None and se is not None  # every trace has enterprise jobs
        out.append(
            (
                "enterprise p99 wait below slurm's",
                f"{de:.1f} s vs {se:.1f} s",
                de < se,
            )
        )
        sj = {
            t: v["jain_fairness"]
            for t, v in s["tiers"].items()
            if v.get("jain_fairness") is not None
        }
        # A tier with one tenant has no fairness between tenants to compare.
        both = sorted(t for t in set(jains) & set(sj) if d["tiers"][t].get("tenants", 0) > 1)
        out.append((
            "Jain's fairness above slurm's in each tier",
            ", ".join(f"{t} {jains[t]:.3f} vs {sj[t]:.3f}" for t in both),
            all(jains[t] > sj[t] for t in both),
        ))  # fmt: skip
        du, su = d["utilisation_while_waiting"], s["utilisation_while_waiting"]
        out.append(
            (
                "utilisation while waiting within 2% of slurm's",
                f"{du:.3f} vs {su:.3f}",
                abs(du - su) <= 0.02,
            )
        )
    return out


def targets_table(results: dict[str, dict[str, Any]], policy: str = "default") -> str:
    rows = targets(results, policy)
    if not rows:
        return ""
    lines = [f"| target ({policy} policy) | measured | met |", "|---|---|---|"]
    for label, measured, met in rows:
        lines.append(
            f"| {label} | {measured} | {'-' if met is None else ('yes' if met else 'no')} |"
        )
    return "\n".join(lines) + "\n"
