"""The simulator's measurement of `estimated_start_at` (apps/scheduling/sim/estimate.py)."""

import json
import random

from apps.scheduling.sim.cli import main
from apps.scheduling.sim.engine import SimSettings, Simulation
from apps.scheduling.sim.estimate import EstimateErrorHook
from apps.scheduling.sim.presets import policy_preset
from apps.scheduling.sim.workload import SimJob


def whole_node_jobs(n: int = 300, seed: int = 3) -> list[SimJob]:
    """Jobs of one or two whole 8-GPU nodes, arriving faster than 4 nodes can serve them: a
    queue builds up, and free GPUs are always whole nodes (no fragmentation)."""
    rng = random.Random(seed)
    jobs, t = [], 0.0
    for i in range(n):
        t += rng.expovariate(1 / 300.0)
        nodes = rng.choice((1, 1, 1, 2))
        tier = rng.choice(("enterprise", "pro", "free"))
        job = SimJob(f"j{i}", t, rng.uniform(60, 3600), 8 * nodes, tenant=f"{tier}-0", tier=tier)
        job.gpus, job.nodes = 8, nodes
        jobs.append(job)
    return jobs


def simulate(jobs, policy: str, hook: EstimateErrorHook | None = None) -> Simulation:
    tiers, config = policy_preset(policy, grace_s=30.0)
    sim = Simulation(jobs, SimSettings(nodes=4, gpus_per_node=8, grace_s=30.0), tiers, config)
    if hook is not None:
        hook.install(sim)
    sim.run()
    return sim


def test_with_true_runtimes_fifo_on_whole_nodes_is_estimated_exactly():
    # FIFO without backfill or preemption starts jobs in submit order as soon as enough GPUs are
    # free; on whole-node jobs free GPUs never fragment. That is the replay itself, so with the
    # true durations (oracle) and the policy's order every estimate is the actual start.
    hook = EstimateErrorHook(order="policy")
    sim = simulate(whole_node_jobs(), "fifo", hook)
    summary = hook.summary()
    oracle = summary["oracle"]["all"]
    assert summary["estimated"] == oracle["jobs"] == 300
    assert oracle["waited"]["n"] > 150  # there was a queue to estimate
    assert oracle["no_estimate"] == 0
    assert oracle["abs_error_p90_s"] == 0.0 and oracle["within_10min"] == 1.0
    assert oracle["started_at_once"] == oracle["started_at_once_estimated_at_once"]
    starts = {r.job_id: r.estimates["oracle"] for r in hook.records}
    assert all(starts[j.job_id] == j.start for j in sim.jobs)
    # The history estimator (median of past runs) is not exact, but it produces figures.
    history = summary["history"]["all"]
    assert history["jobs"] == 300 and history["abs_error_p90_s"] > 0


def test_the_platform_order_sorts_by_tier_then_submit_and_errs_when_the_policy_does_not():
    # The same FIFO run, replayed in queue_position's order (enterprise, pro, free, then submit
    # time): an enterprise job's replay holds only the enterprise jobs queued before it, a part
    # of what FIFO starts first, so its estimate is never late and mostly early.
    hook = EstimateErrorHook(order="platform")
    simulate(whole_node_jobs(), "fifo", hook)
    oracle = hook.summary()["oracle"]
    assert oracle["enterprise"]["bias_p50_s"] < 0
    assert oracle["enterprise"]["late_share"] == 0.0


def test_estimating_does_not_change_the_simulation_and_every_k_samples():
    plain = simulate(whole_node_jobs(), "default")
    hook = EstimateErrorHook(every=7)
    measured = simulate(whole_node_jobs(), "default", hook)
    assert [(j.start, j.end, j.preemptions) for j in measured.jobs] == [
        (j.start, j.end, j.preemptions) for j in plain.jobs
    ]
    assert hook.arrivals == 300 and len(hook.records) == 43  # arrivals 1, 8, 15, ...
    assert [r.job_id for r in hook.records[:2]] == ["j0", "j7"]


def test_the_cli_writes_the_figures_to_summary_json(tmp_path, capsys):
    argv = ["--format", "synthetic", "--jobs", "200", "--nodes", "4", "--load", "1.2"]
    assert main([*argv, "--estimate-error", "2", "--out", str(tmp_path)]) == 0
    summary = json.loads((tmp_path / "summary.json").read_text())["estimate_error"]
    assert summary["every"] == 2 and summary["estimated"] == 100
    for name in ("history", "oracle"):
        figures = summary[name]["all"]
        assert figures["jobs"] == 100
        assert 0 <= figures["abs_error_p50_s"] <= figures["abs_error_p90_s"]
        assert 0 <= figures["within_10min"] <= 1
    assert "estimated_start_at error" in capsys.readouterr().out
