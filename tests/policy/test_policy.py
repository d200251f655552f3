"""The scheduling policy on small hand-made clusters: each test is one mechanism."""

import math

from apps.scheduling.core import ClusterManager, Node
from apps.scheduling.core.policy import (
    PolicyConfig,
    Preempt,
    QueuedJob,
    Reserve,
    RunningJob,
    Scheduler,
    Start,
    TenantUsage,
    TierPolicy,
    Wait,
    decayed_gpu_seconds,
    decide,
    default_tiers,
)


def cluster_of(
    nodes: int, gpus: int = 8, model: str = "A100", config=None, tiers=None, strategy=None
):
    scheduler = Scheduler(ClusterManager(strategy), tiers or default_tiers(), config)
    for i in range(nodes):
        scheduler.add_node(Node(f"n{i}", gpus, model))
    return scheduler


def job(job_id, *, tenant="t", tier="free", gpus=1, nodes=1, submit=0.0, est=100.0, **kw):
    return QueuedJob(job_id, tenant, tier, gpus, submit, est, nodes=nodes, **kw)


def started(decisions):
    return [d.job_id for d in decisions if isinstance(d, Start)]


def test_a_gang_behind_a_stream_of_small_jobs_gets_its_reservation():
    s = cluster_of(2)
    for i in range(16):
        s.submit(job(f"s{i}", est=50 if i < 8 else 100))
    assert len(started(s.decide(0))) == 16
    s.submit(job("gang", tenant="g", gpus=8, nodes=2, submit=1, est=500))
    for i in range(20):
        s.submit(job(f"stream{i}", submit=2 + i, est=1000))
    decisions = s.decide(2)
    assert [d for d in decisions if isinstance(d, Reserve)][0].job_id == "gang"
    assert [d.at for d in decisions if isinstance(d, Reserve)] == [100.0]
    for i in range(8):
        s.finish(f"s{i}", 50)
    s.submit(job("short", tenant="x", submit=50, est=30))
    assert started(s.decide(50)) == ["short"]  # ends by 100; the long stream may not start
    s.finish("short", 80)
    for i in range(8, 16):
        s.finish(f"s{i}", 100)
    assert started(s.decide(100))[0] == "gang"


def test_a_flooding_tenant_gets_only_its_share():
    s = cluster_of(1)
    for i in range(40):
        s.submit(job(f"flood{i}", tenant="flood", submit=i * 0.01))
    assert len(started(s.decide(0.5))) == 8
    for i in range(8):
        s.submit(job(f"light{i}", tenant="light", submit=1 + i * 0.01))
    for i in range(8):
        s.finish(f"flood{i}", 100)
    got = started(s.decide(100))
    assert len(got) == 8
    assert sum(j.startswith("flood") for j in got) <= 4  # at most half, though it asked for 32


def test_weights_split_a_level_between_tiers():
    tiers = {
        "gold": TierPolicy("gold", level=1, weight=3.0),
        "bronze": TierPolicy("bronze", level=1, weight=1.0),
    }
    s = cluster_of(1, tiers=tiers)
    for i in range(20):
        s.submit(job(f"b{i}", tier="bronze", tenant="b", submit=i * 0.01))
        s.submit(job(f"g{i}", tier="gold", tenant="g", submit=i * 0.01))
    got = started(s.decide(1))
    assert sum(j.startswith("g") for j in got) == 6
    assert sum(j.startswith("b") for j in got) == 2


def running(job_id, *, tenant="t", tier="free", gpus=1, started_at=0.0, est_end=10_000.0, **kw):
    return dict(
        job_id=job_id,
        tenant=tenant,
        tier=tier,
        gpus=gpus,
        started_at=started_at,
        est_end=est_end,
        **kw,
    )


def start_running(s, now, *specs):
    """Start jobs through the policy, then give them checkpoint times."""
    for spec in specs:
        s.submit(
            job(
                spec["job_id"],
                tenant=spec["tenant"],
                tier=spec["tier"],
                gpus=spec["gpus"],
                est=spec["est_end"],
            )
        )
    s.decide(now)
    for spec in specs:
        if spec.get("last_checkpoint_at") is not None:
            s.record_checkpoint(spec["job_id"], spec["last_checkpoint_at"])


def test_a_victim_with_a_fresh_checkpoint_is_chosen_over_one_without():
    s = cluster_of(1, gpus=2)
    start_running(
        s, 0, running("stale", tenant="a"), running("fresh", tenant="b", last_checkpoint_at=3500.0)
    )
    s.submit(job("boss", tier="enterprise", tenant="e", submit=3600))
    decisions = s.decide(3600)
    preempts = [d for d in decisions if isinstance(d, Preempt)]
    assert len(preempts) == 1 and preempts[0].victim_ids == ("fresh",)
    assert preempts[0].for_job_id == "boss"
    assert preempts[0].cost_gpu_s == 100.0
    assert s.running["fresh"].preempted_for == "boss"  # it holds its GPU until it stops
    assert "boss" in s.queued and not [d for d in s.decide(3601) if isinstance(d, Preempt)]
    s.finish("fresh", 3610)
    assert started(s.decide(3610)) == ["boss"]


def test_fewer_victims_are_preferred_at_equal_cost():
    s = cluster_of(1, gpus=4)
    start_running(
        s, 0, running("big", gpus=2, tenant="a"), running("x", tenant="b"), running("y", tenant="c")
    )
    s.record_checkpoint("x", 3600 - 50)
    s.record_checkpoint("y", 3600 - 50)
    s.record_checkpoint("big", 3600 - 50)
    s.submit(job("boss", tier="enterprise", tenant="e", gpus=4, submit=3600))
    [p] = [d for d in s.decide(3600) if isinstance(d, Preempt)]
    assert sorted(p.victim_ids) == ["big", "x", "y"]  # all needed: 4 GPUs
    s2 = cluster_of(1, gpus=4)
    start_running(
        s2,
        0,
        running("big", gpus=2, tenant="a"),
        running("x", tenant="b"),
        running("y", tenant="c"),
    )
    for name in ("big", "x", "y"):
        s2.record_checkpoint(name, 3600 - 50)
    s2.submit(job("boss", tier="enterprise", tenant="e", gpus=2, submit=3600))
    [p] = [d for d in s2.decide(3600) if isinstance(d, Preempt)]
    assert p.victim_ids == ("big",)  # same GPU-time lost as x+y, one victim instead of two


def test_it_never_preempts_when_the_job_would_still_not_fit():
    s = cluster_of(1)
    start_running(
        s, 0, running("pro", tier="pro", gpus=4, tenant="p"), running("free", gpus=4, tenant="f")
    )
    s.submit(job("boss", tier="enterprise", tenant="e", gpus=8, submit=3600))
    decisions = s.decide(3600)
    assert not [d for d in decisions if isinstance(d, Preempt)]
    assert [d.job_id for d in decisions if isinstance(d, Reserve)] == ["boss"]
    assert set(s.running) == {"pro", "free"}
    assert len(s.cluster.list_pods()) == 2


def test_a_victim_is_safe_during_its_minimum_runtime_and_after_its_preemption_cap():
    s = cluster_of(1, gpus=1)
    start_running(s, 0, running("young", tenant="f"))
    s.submit(job("boss", tier="enterprise", tenant="e", submit=60))
    assert not [d for d in s.decide(60) if isinstance(d, Preempt)]  # ran 60 s < 15 min
    s.cancel("boss")
    s.finish("young", 100)
    s.submit(job("tired", tenant="f", preemptions=3, submit=100))
    s.decide(100)
    s.submit(job("boss2", tier="enterprise", tenant="e", submit=5000))
    assert not [d for d in s.decide(5000) if isinstance(d, Preempt)]  # preempted 3 times already


def test_no_preemption_loop_between_tiers():
    """Enterprise preempts free; the requeued free job never preempts back, and pro/free
    reclaim only moves GPUs towards the tier under its guarantee."""
    tiers = default_tiers()
    s = cluster_of(1, gpus=1, tiers=tiers)
    start_running(s, 0, running("f1", tenant="f"))
    s.submit(job("e1", tier="enterprise", tenant="e", submit=1000))
    assert [type(d) for d in s.decide(1000)] == [Preempt, Reserve]
    s.finish("f1", 1000)
    s.submit(job("f1", tenant="f", submit=0, preemptions=1))
    assert started(s.decide(1000)) == ["e1"]
    later = s.decide(5000)
    assert not [d for d in later if isinstance(d, Preempt)]
    assert "e1" in s.running


def test_a_tier_under_its_guarantee_reclaims_from_a_borrowing_tier():
    s = cluster_of(1, gpus=10)  # pro is guaranteed 30%: 3 GPUs
    start_running(s, 0, *[running(f"f{i}", tenant="f") for i in range(10)])
    s.submit(job("p1", tier="pro", tenant="p", gpus=2, submit=2000))
    decisions = s.decide(2000)
    [p] = [d for d in decisions if isinstance(d, Preempt)]
    assert len(p.victim_ids) == 2
    s.submit(job("p2", tier="pro", tenant="p", gpus=2, submit=2001))
    # p1 waits for its victims; its GPUs count towards pro's guarantee already.
    assert not [d for d in s.decide(2001) if isinstance(d, Preempt)]
    for victim in p.victim_ids:
        s.finish(victim, 2030)
    assert started(s.decide(2030)) == ["p1"]
    # pro would hold 4 > 3 guaranteed GPUs: no more reclaiming.
    assert not [d for d in s.decide(2001) if isinstance(d, Preempt)]


def test_an_aged_job_goes_ahead_of_its_level():
    tiers = default_tiers()
    s = cluster_of(1, gpus=1, tiers=tiers)
    s.submit(job("blocker", tenant="x", est=200_000))
    s.decide(0)
    s.submit(job("old-free", tenant="f", submit=1))
    for i in range(5):
        s.submit(job(f"pro{i}", tier="pro", tenant="p", submit=2 + i))
    s.finish("blocker", 180_000)  # old-free waited > 48 h: aged
    assert started(s.decide(180_000)) == ["old-free"]


def test_a_young_job_of_a_heavier_weight_goes_first():
    s = cluster_of(1, gpus=1)
    s.submit(job("blocker", tenant="x", est=1000))
    s.decide(0)
    s.submit(job("free1", tenant="f", submit=1))
    s.submit(job("pro1", tier="pro", tenant="p", submit=2))
    s.finish("blocker", 1000)
    assert started(s.decide(1000)) == ["pro1"]


def test_enterprise_waits_only_for_capacity():
    s = cluster_of(1, gpus=2)
    start_running(
        s,
        0,
        running("r1", tier="pro", tenant="p", est_end=100),
        running("r2", tier="pro", tenant="p", est_end=200),
    )
    for i in range(10):
        s.submit(job(f"pro{i}", tier="pro", tenant="p", submit=1 + i))
    s.submit(job("ent", tier="enterprise", tenant="e", submit=50))
    s.finish("r1", 100)
    assert started(s.decide(100)) == ["ent"]


def test_a_tier_never_exceeds_its_borrowing_limit():
    tiers = {"capped": TierPolicy("capped", guaranteed_share=0.25, borrowing_limit=0.25)}
    s = cluster_of(1, gpus=8, tiers=tiers)
    for i in range(8):
        s.submit(job(f"c{i}", tier="capped", submit=i))
    decisions = s.decide(10, explain=True)
    assert len(started(decisions)) == 4
    assert any("borrowing limit" in d.reason for d in decisions if isinstance(d, Wait))


def test_wait_reasons_name_the_missing_resource():
    s = cluster_of(1, gpus=4, model="A100-40GB")
    s.submit(job("big", gpus=8, gpu_models=("A100-40GB",)))
    s.submit(job("h100", tenant="u", gpus=1, gpu_models=("H100",)))
    decisions = s.decide(0, explain=True)
    reasons = {d.job_id: d.reason for d in decisions if isinstance(d, Wait)}
    assert "more than the cluster can offer" in reasons["big"]
    assert "1 free H100 GPU" in reasons["h100"]


def test_fifo_blocks_at_the_head():
    s = cluster_of(
        1, gpus=2, config=PolicyConfig(ordering="fifo", backfill=False, preemption=False)
    )
    s.submit(job("a", est=100))
    s.decide(0)
    s.submit(job("wide", gpus=2, submit=1))
    s.submit(job("small", submit=2))
    assert started(s.decide(2)) == []  # no backfill: small waits behind wide


def test_stateless_decide_matches_the_scheduler():
    cluster = ClusterManager()
    for i in range(2):
        cluster.add_node(Node(f"n{i}", 4, "A100"))
    live = cluster_of(2, gpus=4)
    live.submit(job("r1", gpus=4, tenant="a", est=500))
    [start] = [d for d in live.decide(0) if isinstance(d, Start)]
    from apps.scheduling.core import Pod

    cluster.add_pod(Pod("r1", gpus=4), start.placement)
    queued = [
        job("gang", gpus=4, nodes=2, tenant="b", submit=1),
        job("q1", tenant="c", submit=2, est=50),
    ]
    run = [RunningJob("r1", "a", "free", 4, 0.0, 500.0, start.placement)]
    got = decide(10, cluster, queued, run, default_tiers(), {"a": TenantUsage("free", 4 * 10.0)})
    kinds = [(type(d).__name__, d.job_id) for d in got]
    assert kinds == [("Reserve", "gang"), ("Start", "q1")]
    for q in queued:
        q.seq = -1
        live.submit(q)
    assert [(type(d).__name__, d.job_id) for d in live.decide(10, explain=True)] == kinds


def test_decayed_usage_halves_every_half_life():
    h = 3600.0
    steady = decayed_gpu_seconds([(0, 100 * h, 2)], 100 * h, h)
    assert math.isclose(steady, 2 * h / math.log(2), rel_tol=1e-6)
    one = decayed_gpu_seconds([(0, 10, 1)], 10, h)
    later = decayed_gpu_seconds([(0, 10, 1)], 10 + h, h)
    assert math.isclose(later, one / 2, rel_tol=1e-9)


def test_a_long_backfill_job_is_steered_off_the_reserved_node():
    s = cluster_of(2, strategy="spread")
    s.submit(job("ends-soon", gpus=4, tenant="a", est=100))
    s.submit(job("ends-late", gpus=4, tenant="b", est=1000))
    assert len(started(s.decide(0))) == 2
    for node in ("n0", "n1"):  # 4 GPUs busy on each node
        assert s.view.free[node] == 4
    soon_node = s.running["ends-soon"].alloc[0][0]
    s.submit(job("wide", gpus=8, tenant="c", submit=1, est=100))
    s.submit(job("long", gpus=4, tenant="d", submit=2, est=5000))
    decisions = s.decide(2)
    [reserve] = [d for d in decisions if isinstance(d, Reserve)]
    assert reserve.nodes == (soon_node,) and reserve.at == 100
    [start] = [d for d in decisions if isinstance(d, Start)]
    assert start.job_id == "long" and start.placement.nodes != [soon_node]


def test_several_reservations_hold_disjoint_nodes():
    s = cluster_of(3, config=PolicyConfig(reservations=2), strategy="spread")
    for i in range(3):
        s.submit(job(f"r{i}", gpus=4, tenant=f"t{i}", est=100 * (i + 1)))
    s.decide(0)
    s.submit(job("w1", gpus=8, tenant="x", submit=1))
    s.submit(job("w2", gpus=8, tenant="y", submit=2))
    reserves = [d for d in s.decide(2) if isinstance(d, Reserve)]
    assert [d.job_id for d in reserves] == ["w1", "w2"]
    assert not set(reserves[0].nodes) & set(reserves[1].nodes)
    assert [d.at for d in reserves] == [100, 200]


def test_the_dispatcher_seam_over_three_ticks_of_a_preemption():
    """decide() from plain rows each tick: preempt, wait for the victim, then start."""
    from apps.scheduling.core import Pod

    def fresh_cluster(running_rows):
        cluster = ClusterManager()
        cluster.add_node(Node("n0", 2, "A100"))
        for row in running_rows:
            cluster.add_pod(Pod(row.job_id, gpus=row.gpus), row.placement)
        return cluster

    tiers = default_tiers()
    setup = cluster_of(1, gpus=2)
    start_running(setup, 0, running("f1", tenant="f"), running("f2", tenant="g"))
    setup.record_checkpoint("f2", 3000.0)
    rows = [
        RunningJob("f1", "f", "free", 1, 0.0, 10_000.0, setup.running["f1"].placement),
        RunningJob(
            "f2",
            "g",
            "free",
            1,
            0.0,
            10_000.0,
            setup.running["f2"].placement,
            last_checkpoint_at=3000.0,
        ),
    ]
    boss = job("boss", tier="enterprise", tenant="e", submit=3600)
    # Tick 1: the cheaper victim (f2, saved at 3000) is signalled; boss holds a reservation.
    first = decide(3600, fresh_cluster(rows), [boss], rows, tiers, config=PolicyConfig(grace_s=30))
    [p] = [d for d in first if isinstance(d, Preempt)]
    assert p.victim_ids == ("f2",) and p.for_job_id == "boss"
    held = [d.job_id for d in first if isinstance(d, Reserve)]
    assert held == ["boss"]
    # Tick 2: f2 is `preempting` (still on its GPU until it stops): nothing new happens.
    rows[1].preempted_for, rows[1].est_end = "boss", 3630.0
    second = decide(3610, fresh_cluster(rows), [boss], rows, tiers, held_reservation=held)
    assert not [d for d in second if isinstance(d, Preempt | Start)]
    assert [d.at for d in second if isinstance(d, Reserve)] == [3630.0]
    # Tick 3: f2 stopped (its attempt ended, the job went back to the queue): boss starts first.
    back = job("f2", tenant="g", submit=0, preemptions=1)
    third = decide(
        3630, fresh_cluster(rows[:1]), [boss, back], rows[:1], tiers, held_reservation=held
    )
    assert started(third) == ["boss"]
    [again] = [d for d in third if isinstance(d, Reserve)]
    assert again.job_id == "f2" and again.at == 3730.0  # boss ends by its 100 s estimate
    assert again.reason.startswith(
        "first in line, reserved 1 node(s) from 1970-01-01T01:02:10Z"
    )  # t=3730, as ISO 8601 (issue 30)


def test_decide_counts_cordoned_nodes_and_foreign_pods_as_busy():
    from apps.scheduling.core import Pod

    cluster = ClusterManager()
    for name in ("n0", "n1", "n2"):
        cluster.add_node(Node(name, 8, "A100"))
    cluster.cordon("n0")
    cluster.schedule_pod(Pod("held-by-someone", gpus=8))  # not a job the policy knows
    queued = [job("wide", gpus=8, nodes=2)]
    decisions = decide(0, cluster, queued, [], default_tiers())
    assert not started(decisions)
    [wait] = [d for d in decisions if isinstance(d, Wait)]
    assert "more than the cluster can offer" in wait.reason  # only n2 is usable


def test_preemption_waits_when_a_fitting_node_arrives_within_the_tolerance():
    """An enterprise job whose tier tolerates 10 minutes waits for a node being provisioned
    (ready in 5 minutes) instead of preempting; one ready in 20 minutes does not hold it back."""
    from dataclasses import replace

    from apps.scheduling.core import Pod
    from apps.scheduling.core.policy import ArrivingNode

    tiers = default_tiers()
    tiers["enterprise"] = replace(tiers["enterprise"], preempt_wait_s=600)
    setup = cluster_of(1, gpus=2)
    start_running(setup, 0, running("f1", tenant="f", gpus=2))
    placement = setup.running["f1"].placement

    def tick(arriving):
        rows = [RunningJob("f1", "f", "free", 2, 0.0, 10_000.0, placement)]  # decide marks victims
        cluster = ClusterManager()
        cluster.add_node(Node("n0", 2, "A100"))
        cluster.add_pod(Pod("f1", gpus=2), placement)
        boss = job("boss", tier="enterprise", tenant="e", gpus=2, submit=3600)
        return decide(3600, cluster, [boss], rows, tiers, arriving=arriving)

    soon = [ArrivingNode(ready_at=3600 + 300, gpu_model="A100", gpus=2)]
    assert not [d for d in tick(soon) if isinstance(d, Preempt)]
    too_small = [ArrivingNode(ready_at=3600 + 300, gpu_model="A100", gpus=1)]
    late = [ArrivingNode(ready_at=3600 + 1200, gpu_model="A100", gpus=2)]
    for arriving in (too_small, late, []):
        [p] = [d for d in tick(arriving) if isinstance(d, Preempt)]
        assert p.victim_ids == ("f1",)
