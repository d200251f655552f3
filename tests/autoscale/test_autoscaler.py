"""The autoscaler on hand-made scenarios (pure core, no Django)."""

from apps.scheduling.core.autoscale import (
    Autoscaler,
    Demand,
    Forecaster,
    NodeStatus,
    Pending,
    SkuLimits,
)

H100 = SkuLimits(gpus_per_node=8, min_nodes=0, max_nodes=20, cooldown_s=600)


def busy(name, ends_at=None, gpus=8, preemptible_only=False):
    freeing = ((ends_at, gpus),) if ends_at is not None else ()
    return NodeStatus(
        name, gpus=gpus, free_gpus=0, preemptible_only=preemptible_only, freeing=freeing
    )


def test_a_gang_demand_scales_by_whole_nodes():
    scaler = Autoscaler({"H100": H100}, mode="reactive", provision_lag_s=300)
    decision = scaler.decide(0, "H100", [], [Demand(gpus=8, nodes=4)])
    assert decision.provision == 4
    # Two members of one gang never share a node, even if they would fit on one.
    decision = Autoscaler({"H100": H100}, mode="reactive").decide(
        0, "H100", [], [Demand(gpus=3, nodes=2)]
    )
    assert decision.provision == 2
    # Two single-node jobs do share.
    decision = Autoscaler({"H100": H100}, mode="reactive").decide(
        0, "H100", [], [Demand(3), Demand(3)]
    )
    assert decision.provision == 1


def test_capacity_that_frees_within_the_lag_absorbs_a_short_burst():
    nodes = [busy("a", ends_at=60), busy("b", ends_at=120)]
    burst = [Demand(gpus=1, est_runtime_s=30)] * 64  # 64 x 30 s of 1 GPU, on 16 GPUs freeing soon
    for mode in ("reactive", "predictive"):
        scaler = Autoscaler({"H100": H100}, mode=mode, provision_lag_s=300)
        for _ in range(64):
            scaler.observe_arrival("H100", 0, Demand(1))
        decision = scaler.decide(1, "H100", nodes, burst)
        assert decision.provision == 0, (mode, decision)


def test_a_long_queue_beyond_the_lag_asks_for_nodes():
    nodes = [busy("a", ends_at=3600)]
    decision = Autoscaler({"H100": H100}, mode="reactive", provision_lag_s=300).decide(
        0, "H100", nodes, [Demand(gpus=8, est_runtime_s=3600)] * 3
    )
    assert decision.provision == 3
    assert "queued work" in decision.reason


def test_nodes_being_provisioned_count():
    scaler = Autoscaler({"H100": H100}, mode="reactive", provision_lag_s=300)
    decision = scaler.decide(
        0, "H100", [], [Demand(gpus=8)] * 3, pending=[Pending(count=2, ready_at=200)]
    )
    assert decision.provision == 1


def test_scale_down_never_removes_a_node_with_non_preemptible_work():
    nodes = [
        NodeStatus("idle", gpus=8, free_gpus=8, idle_since=0),
        busy("important", ends_at=None),
        busy("preemptible", ends_at=None, preemptible_only=True),
    ]
    # Low demand: only the idle node goes; busy nodes are still needed.
    decision = Autoscaler({"H100": H100}, mode="reactive").decide(10_000, "H100", nodes, [])
    assert (decision.terminate, decision.drain) == (("idle",), ())
    # The limit drops to one node: the idle one goes, the preemptible one is drained, and the
    # node with non-preemptible work stays even though the limit is exceeded.
    tight = SkuLimits(gpus_per_node=8, max_nodes=0, cooldown_s=600)
    decision = Autoscaler({"H100": tight}, mode="reactive").decide(10_000, "H100", nodes, [])
    assert decision.terminate == ("idle",)
    assert decision.drain == ("preemptible",)
    assert "important" not in decision.terminate + decision.drain


def test_no_scale_down_before_the_cooldown():
    scaler = Autoscaler({"H100": H100}, mode="reactive", provision_lag_s=300)
    decision = scaler.decide(
        100, "H100", [NodeStatus("idle", gpus=8, free_gpus=8, idle_since=0)], []
    )
    assert decision.terminate == () and decision.drain == ()


def test_min_and_max_nodes_hold():
    limits = SkuLimits(gpus_per_node=8, min_nodes=2, max_nodes=3)
    scaler = Autoscaler({"H100": limits}, mode="reactive")
    assert scaler.decide(0, "H100", [], []).provision == 2
    assert scaler.decide(0, "H100", [], [Demand(8)] * 10).provision == 3


def test_a_gpu_hour_budget_caps_scale_up():
    limits = SkuLimits(gpus_per_node=8, gpu_hour_budget=20, budget_horizon_s=3600)
    scaler = Autoscaler({"H100": limits}, mode="reactive")
    decision = scaler.decide(0, "H100", [], [Demand(8)] * 5)
    assert decision.provision == 2  # 2 nodes x 8 GPUs x 1 h = 16 GPU-hours <= 20
    assert "budget" in decision.reason


def test_no_flapping_on_a_sawtooth_load():
    scaler = Autoscaler({"H100": H100}, mode="reactive", provision_lag_s=300)
    nodes: list[NodeStatus] = []
    desired, changes, last = [], 0, None
    for step in range(60):  # a minute per step; demand jumps every 3 minutes
        now = step * 60.0
        queue = [Demand(8, est_runtime_s=600)] * (4 if (step // 3) % 2 == 0 else 0)
        decision = scaler.decide(now, "H100", nodes, queue)
        nodes = nodes + [
            NodeStatus(f"n{step}-{i}", 8, 8, idle_since=now) for i in range(decision.provision)
        ]
        nodes = [n for n in nodes if n.name not in decision.terminate]
        desired.append(decision.desired)
        if last is not None and decision.desired != last:
            changes += 1
        last = decision.desired
    assert changes <= 2, desired


def test_the_forecast_learns_a_daily_season():
    forecast = Forecaster(bin_s=3600)
    for day in range(5):
        for hour in range(24):
            t = day * 86400 + hour * 3600
            forecast.observe(t, 80 if 9 <= hour < 17 else 8)
    forecast.observe(5 * 86400, 8)  # closes the last bin of day 4
    busy_hour, night_hour = forecast.rate(10 * 3600), forecast.rate(2 * 3600)
    assert busy_hour > 3 * night_hour


def test_burst_share_keeps_room_for_a_recent_burst():
    def scaler(share):
        s = Autoscaler({"H100": H100}, mode="predictive", provision_lag_s=300, burst_share=share)
        for hour in range(13):  # a quiet morning, then a single burst of 64 GPUs at noon
            s.observe_arrival("H100", hour * 3600.0, Demand(1))
        s.observe_arrival("H100", 12 * 3600.0 + 60, Demand(8, nodes=8))
        s.observe_arrival("H100", 13 * 3600.0, Demand(1))
        return s

    now = 14 * 3600.0  # two hours after the burst
    plain = scaler(0.0).decide(now, "H100", [], [])
    ready = scaler(1.0).decide(now, "H100", [], [])
    assert plain.provision <= 1  # the smoothed rate: a GPU or so
    # 64 GPUs in a 15-minute bin = 64/900 GPU/s; over a 300 s lag, decayed for 2 h: ~20 GPUs
    assert ready.provision >= plain.provision + 2
    assert "forecast" in ready.reason
    assert Forecaster(burst_half_life_s=3600).burst_decay < Forecaster().burst_decay


def test_a_node_that_never_ran_anything_goes_without_waiting_for_the_cooldown():
    limits = SkuLimits(gpus_per_node=8, cooldown_s=600, unused_cooldown_s=60)
    scaler = Autoscaler({"H100": limits}, mode="reactive", provision_lag_s=300)
    assert scaler.decide(0, "H100", [], [Demand(8)] * 2).provision == 2  # scaled up at t=0
    # The queue was served elsewhere; the two nodes arrived at 300 and one ran a job since.
    nodes = [
        NodeStatus("fresh", 8, 8, idle_since=300, never_used=True),
        NodeStatus("was-used", 8, 8, idle_since=300),
    ]
    early = scaler.decide(330, "H100", nodes, [])
    assert early.terminate == ()  # not idle for unused_cooldown_s yet
    later = scaler.decide(400, "H100", nodes, [])
    # Inside the cooldown after the scale-up: hysteresis holds the node that ran work, but the
    # node that never ran anything goes.
    assert later.terminate == ("fresh",)
    assert later.desired == 1
    assert "never used" in later.reason
    # A node that is never used but wanted for queued work stays.
    wanted = scaler.decide(400, "H100", nodes, [Demand(8, est_runtime_s=3600)] * 2)
    assert wanted.terminate == ()


def test_momentum_plans_for_a_stream_that_a_closed_bin_does_not_show_yet():
    def scaler(share):
        s = Autoscaler({"H100": H100}, mode="predictive", provision_lag_s=300, momentum_share=share)
        for i in range(10):  # a sweep: an 8-GPU job every 30 s, inside one 15-minute bin
            s.observe_arrival("H100", 60 + 30.0 * i, Demand(8))
        return s

    now = 360.0
    assert scaler(0.0).decide(now, "H100", [], []).provision == 0  # the bin has not closed
    ready = scaler(1.0).decide(now, "H100", [], [])
    # 80 GPUs, most of them in the last 5 minutes: a pace of about 10 GPUs/min -> ~7 nodes
    assert 5 <= ready.provision <= 9, ready
    assert "forecast" in ready.reason
    # An hour after the sweep stopped its momentum is gone: only the smoothed forecast is left.
    later = now + 3600
    assert scaler(1.0).decide(later, "H100", [], []) == scaler(0.0).decide(later, "H100", [], [])
    assert Forecaster(momentum_half_life_s=0).momentum(0, 300) == 0.0


def test_nodes_being_provisioned_count_against_the_forecast():
    """The forecast's nodes are asked for once, not again at every call until they arrive."""
    scaler = Autoscaler({"H100": H100}, mode="predictive", provision_lag_s=300, burst_share=1.0)
    for hour in range(13):  # a quiet morning, then a burst of 64 GPUs at noon (as above)
        scaler.observe_arrival("H100", hour * 3600.0, Demand(1))
    scaler.observe_arrival("H100", 12 * 3600.0 + 60, Demand(8, nodes=8))
    scaler.observe_arrival("H100", 13 * 3600.0, Demand(1))
    now = 13 * 3600.0 + 60
    first = scaler.decide(now, "H100", [], [])
    assert first.provision >= 2
    again = scaler.decide(now + 60, "H100", [], [], [Pending(first.provision, now + 300)])
    assert again.provision == 0, again
    assert again.desired == first.desired


def test_booting_nodes_nothing_wants_any_more_are_cancelled():
    """cancel_booting: a node asked for a queued job that then started elsewhere is given back
    before it arrives (the latest due first), so billing stops at the cancel."""
    for cancel in (False, True):
        scaler = Autoscaler(
            {"H100": H100}, mode="reactive", provision_lag_s=300, cancel_booting=cancel
        )
        assert scaler.decide(0, "H100", [], [Demand(8)] * 2).provision == 2
        # The queue ran on a node that freed up; the two requests are still booting.
        nodes = [busy("a", ends_at=3600)]
        later = scaler.decide(60, "H100", nodes, [], [Pending(2, 300)])
        assert later.provision == 0
        assert later.cancel == (2 if cancel else 0), later
        if cancel:
            assert "cancelled" in later.reason
            assert later.desired == 1
    # A booting node the queue still needs is kept.
    scaler = Autoscaler({"H100": H100}, mode="reactive", provision_lag_s=300, cancel_booting=True)
    kept = scaler.decide(60, "H100", [], [Demand(8, est_runtime_s=600)], [Pending(2, 300)])
    assert kept.cancel == 1 and kept.provision == 0


def test_predictive_cancels_only_what_the_forecast_no_longer_wants():
    scaler = Autoscaler(
        {"H100": H100}, mode="predictive", provision_lag_s=300, momentum_share=1.0,
        cancel_booting=True,
    )  # fmt: skip
    for i in range(10):
        scaler.observe_arrival("H100", 30.0 * i, Demand(8))
    # about 7 nodes of pace: of 10 booting nodes, the 3 beyond it go, not more
    d = scaler.decide(300, "H100", [], [], [Pending(10, 500)])
    assert 1 <= d.cancel <= 5, d
    # an hour later the momentum is gone: what the smoothed forecast (which has seen the
    # sweep's bin close) does not want goes
    later = scaler.decide(3900, "H100", [], [], [Pending(4, 4000)])
    assert later.cancel >= 3 and later.cancel + later.desired == 4, later


def test_spare_nodes_keep_whole_nodes_free():
    scaler = Autoscaler({"H100": H100}, mode="predictive", provision_lag_s=300, spare_nodes=2)
    assert scaler.decide(0, "H100", [], []).provision == 2
    # Two idle whole nodes are the spare; a busy node is not.
    nodes = [busy("a", ends_at=3600), NodeStatus("b", 8, 8, idle_since=0)]
    assert scaler.decide(60, "H100", nodes, [], [Pending(1, 300)]).provision == 0
    assert scaler.decide(60, "H100", nodes, []).provision == 1


def test_unwanted_idle_nodes_go_after_their_own_cooldown():
    limits = SkuLimits(gpus_per_node=8, cooldown_s=600, unwanted_cooldown_s=120)
    scaler = Autoscaler({"H100": limits}, mode="reactive", provision_lag_s=300)
    nodes = [NodeStatus("was-used", 8, 8, idle_since=0), busy("b", ends_at=9999)]
    assert scaler.decide(60, "H100", nodes, []).terminate == ()
    assert scaler.decide(130, "H100", nodes, []).terminate == ("was-used",)
    # without the option it waits for the cooldown
    plain = Autoscaler({"H100": H100}, mode="reactive", provision_lag_s=300)
    assert plain.decide(130, "H100", nodes, []).terminate == ()
