"""The autoscaler in the simulator (apps/scheduling/sim/autoscale.py) on a hand-made stream."""

from apps.scheduling.sim.autoscale import AutoscaleHook, AutoscaleSettings
from apps.scheduling.sim.engine import SimSettings, Simulation
from apps.scheduling.sim.presets import policy_preset
from apps.scheduling.sim.workload import SimJob


def stream():
    """A sweep of twelve 8-GPU jobs, one every 30 s, each running 20 minutes."""
    return [
        SimJob(f"j{i:02d}", submit=30.0 * i, duration=1200.0, gpus_total=8, tenant="t",
               tier="pro", gpus=8, nodes=1)
        for i in range(12)
    ]  # fmt: skip


def simulate(unused_cooldown_s):
    tiers, config = policy_preset("default")
    sim = Simulation(stream(), SimSettings(nodes=0, gpus_per_node=8), tiers, config)
    settings = AutoscaleSettings(
        "predictive", provision_lag_s=300, cooldown_s=600, momentum_share=2,
        unused_cooldown_s=unused_cooldown_s,
    )  # fmt: skip
    hook = AutoscaleHook(settings, 8)
    hook.install(sim)
    sim.run()
    used = {name for job in sim.jobs for _, _, names, _ in job.segments for name in names.split(";")}
    never = {name: b for name, b in sim.billing.items() if name not in used}
    return sim, never


def test_nodes_the_momentum_asked_for_and_nobody_used_go_before_the_cooldown():
    sim, never = simulate(unused_cooldown_s=60)
    assert all(j.end is not None for j in sim.jobs)
    assert never, "the momentum over-asks at the end of the sweep"
    for _, up, down, _ in never.values():
        # held while the stream's momentum still wants it, then gone well before the cooldown
        assert down is not None and down - up < 600
    # With the unused cooldown as long as the cooldown, the same nodes are paid ~10 minutes idle.
    slow_sim, slow_never = simulate(unused_cooldown_s=600)
    assert max(d - u for _, u, d, _ in slow_never.values()) >= 600
    assert sim.paid_gpu_hours() < slow_sim.paid_gpu_hours()
