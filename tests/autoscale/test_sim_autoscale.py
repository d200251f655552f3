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
    used = {
        name for job in sim.jobs for _, _, names, _ in job.segments for name in names.split(";")
    }
    never = {name: b for name, b in sim.billing.items() if name not in used}
    return sim, never


def test_nodes_the_momentum_asked_for_and_nobody_used_go_before_the_cooldown():
    sim, never = simulate(unused_cooldown_s=60)
    assert all(j.end is not None for j in sim.jobs)
    assert never, "the momentum over-asks at the end of the sweep"
    idle = {name: down - up for name, (_, up, down, _) in never.items()}
    # held while the stream's decaying momentum still wants them, never past the cooldown
    assert all(seconds <= 600 for seconds in idle.values())
    assert min(idle.values()) <= 60 + 60  # unused_cooldown_s, plus a tick
    # With the unused cooldown as long as the cooldown, the same nodes are paid 10+ minutes idle.
    slow_sim, slow_never = simulate(unused_cooldown_s=600)
    assert min(d - u for _, u, d, _ in slow_never.values()) >= 600
    assert sum(idle.values()) < 0.6 * sum(d - u for _, u, d, _ in slow_never.values())
    assert sim.paid_gpu_hours() < slow_sim.paid_gpu_hours()


def preemption_run(preempt_wait_s):
    """One node runs a free (preemptible) job from t=0; an enterprise job for a whole node arrives at
    300 s, before the free job's 10-minute minimum runtime; the autoscaler asks for a node that
    boots for 10 minutes (ready at 900 s)."""
    from dataclasses import replace

    tiers, config = policy_preset("default")
    tiers = {k: replace(t, preempt_wait_s=preempt_wait_s) for k, t in tiers.items()}
    jobs = [
        SimJob("free", submit=0.0, duration=7200.0, gpus_total=8, tenant="f", tier="free",
               gpus=8, nodes=1),
        SimJob("ent", submit=300.0, duration=3600.0, gpus_total=8, tenant="e", tier="enterprise",
               gpus=8, nodes=1),
    ]  # fmt: skip
    sim = Simulation(jobs, SimSettings(nodes=1, gpus_per_node=8), tiers, config)
    settings = AutoscaleSettings("reactive", provision_lag_s=600, min_nodes=1, max_nodes=2)
    AutoscaleHook(settings, 8).install(sim)
    sim.run()
    return sim


def test_preemption_waits_for_the_node_the_autoscaler_is_booting():
    eager = preemption_run(0.0)  # preempts once the free job has run 10 minutes
    assert eager.by_id["free"].preemptions == 1
    assert eager.by_id["ent"].start < 900
    patient = preemption_run(600.0)  # the booting node is due within the tolerance: wait
    assert patient.by_id["free"].preemptions == 0
    assert patient.by_id["ent"].start == 900


def sweep_run(**options):
    tiers, config = policy_preset("default")
    sim = Simulation(stream(), SimSettings(nodes=0, gpus_per_node=8), tiers, config)
    settings = AutoscaleSettings(
        "predictive", provision_lag_s=300, cooldown_s=600, momentum_share=2, **options
    )
    hook = AutoscaleHook(settings, 8)
    hook.install(sim)
    sim.run()
    return sim, hook


def test_cancelled_booting_nodes_never_arrive_and_are_paid_until_the_cancel():
    plain, _ = sweep_run()
    sim, hook = sweep_run(cancel_booting=True)
    assert all(j.end is not None for j in sim.jobs)
    assert hook.cancelled > 0 and hook.summary()["nodes_cancelled"] == hook.cancelled
    cancelled = {n: b for n, b in sim.billing.items() if b[1] is None}
    assert len(cancelled) == hook.cancelled
    for requested, _up, down, _gpus in cancelled.values():
        assert requested <= down < requested + 300  # given back while still booting
    used = {
        name for job in sim.jobs for _, _, names, _ in job.segments for name in names.split(";")
    }
    assert not used & set(cancelled)
    assert sim.paid_gpu_hours() < plain.paid_gpu_hours()


def test_deciding_on_arrival_asks_for_the_node_at_the_submission():
    def start(on_arrival):
        tiers, config = policy_preset("default")
        job = SimJob("j", submit=10.0, duration=600.0, gpus_total=8, tenant="t", tier="pro",
                     gpus=8, nodes=1)  # fmt: skip
        sim = Simulation([SimJob("first", 0.0, 60.0, 1, "t", "pro", gpus=1, nodes=1), job],
                         SimSettings(nodes=0, gpus_per_node=8), tiers, config)  # fmt: skip
        settings = AutoscaleSettings("reactive", provision_lag_s=300, decide_on_arrival=on_arrival)
        AutoscaleHook(settings, 8).install(sim)
        sim.run()
        return sim.by_id["j"].start

    assert start(False) == 360.0  # asked at the next 60 s tick
    assert start(True) == 310.0  # asked when it arrived


def test_the_clairvoyant_reference_has_the_node_ready_at_the_submission():
    """oracle_lookahead_s (analysis only): jobs due within the lookahead count as queued, so the
    node asked for them arrives with them."""
    tiers, config = policy_preset("default")
    jobs = [SimJob("j", submit=600.0, duration=600.0, gpus_total=8, tenant="t", tier="pro",
                   gpus=8, nodes=1)]  # fmt: skip
    sim = Simulation(jobs, SimSettings(nodes=0, gpus_per_node=8), tiers, config)
    settings = AutoscaleSettings("reactive", provision_lag_s=300, oracle_lookahead_s=300)
    AutoscaleHook(settings, 8).install(sim)
    sim.run()
    assert sim.by_id["j"].start == 600.0
    ((requested, up, _down, _gpus),) = sim.billing.values()
    assert (requested, up) == (300.0, 600.0)
