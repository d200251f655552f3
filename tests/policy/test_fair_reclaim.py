"""Fair share inside a tier (`fair-reclaim`): aging capped at the share and tenant reclaim."""

from apps.scheduling.core.policy import FAIR_RECLAIM, PolicyConfig, Preempt, default_tiers
from tests.policy.test_policy import cluster_of, job, running, start_running, started

HOUR = 3600.0
RECLAIM = PolicyConfig(**FAIR_RECLAIM)


def preempts(decisions):
    return [d for d in decisions if isinstance(d, Preempt)]


def test_tenant_shares_fill_water_levels_by_demand_and_weight():
    s = cluster_of(1, gpus=8)
    s.tenant_weights = {"heavy": 1.0, "light": 1.0, "big": 3.0}
    start_running(s, 0, *[running(f"h{i}", tenant="heavy") for i in range(6)])
    start_running(s, 0, running("l0", tenant="light"), running("b0", tenant="big"))
    s.submit(job("l1", tenant="light", submit=1))
    for i in range(8):
        s.submit(job(f"b{i + 1}", tenant="big", submit=1))
    shares = s.tenant_shares("free")
    # 8 GPUs held, 1.6 a unit of weight: light (wants 2) and heavy (wants 6) get 1.6 each,
    # big (weight 3, wants 9) 4.8.
    assert {t: (run, round(share, 6)) for t, (run, share) in shares.items()} == {
        "light": (1, 1.6),
        "heavy": (6, 1.6),
        "big": (1, 4.8),
    }


def test_aging_lifts_only_tenants_below_their_share():
    tiers = default_tiers()
    s = cluster_of(1, gpus=2, tiers=tiers, config=RECLAIM)
    start_running(s, 0, running("h-run", tenant="heavy", est_end=200_000))
    start_running(s, 0, running("blocker", tenant="x", est_end=180_000))
    s.submit(job("h-old", tenant="heavy", submit=1))  # heavy holds 1 of its 1-GPU share
    s.submit(job("x-old", tenant="x", submit=2))
    for i in range(3):  # younger than 2 x pro's 24 h: not overdue
        s.submit(job(f"pro{i}", tier="pro", tenant="p", submit=100_000 + i))
    s.finish("blocker", 180_000)  # both free jobs waited > 48 h; x now holds nothing
    assert started(s.decide(180_000)) == ["x-old"]


def test_a_tenant_at_its_share_ages_after_twice_the_age_limit():
    tiers = default_tiers()
    s = cluster_of(1, gpus=2, tiers=tiers, config=RECLAIM)
    start_running(s, 0, running("h-run", tenant="heavy", est_end=400_000))
    start_running(s, 0, running("blocker", tenant="x", est_end=360_000))
    s.submit(job("h-old", tenant="heavy", submit=1))  # heavy holds its share: ages after 96 h
    s.submit(job("x-new", tenant="x", submit=300_000))
    for i in range(3):
        s.submit(job(f"pro{i}", tier="pro", tenant="p", submit=300_000 + i))
    s.finish("blocker", 360_000)  # h-old waited 100 h, past 2 x 48 h: lifted over the pro jobs
    assert started(s.decide(360_000)) == ["h-old"]


def test_without_the_option_every_aged_job_is_lifted_in_submit_order():
    tiers = default_tiers()
    s = cluster_of(1, gpus=2, tiers=tiers, config=PolicyConfig(aging_within_share=False))
    start_running(s, 0, running("h-run", tenant="heavy", est_end=200_000))
    start_running(s, 0, running("blocker", tenant="x", est_end=180_000))
    s.submit(job("h-old", tenant="heavy", submit=1))
    s.submit(job("x-old", tenant="x", submit=2))
    s.finish("blocker", 180_000)
    assert started(s.decide(180_000)) == ["h-old"]


def test_a_tenant_below_its_share_reclaims_from_one_above_after_waiting():
    s = cluster_of(1, gpus=4, config=RECLAIM)
    start_running(s, 0, *[running(f"h{i}", tenant="heavy") for i in range(4)])
    s.submit(job("l1", tenant="light", submit=2 * HOUR))
    assert not preempts(s.decide(2 * HOUR + 60))  # it has not waited 30 minutes yet
    [p] = preempts(s.decide(2 * HOUR + 1900))
    assert len(p.victim_ids) == 1 and p.for_job_id == "l1"
    assert s.running[p.victim_ids[0]].tenant == "heavy"


def test_no_reclaim_that_would_take_the_victim_tenant_below_its_share():
    s = cluster_of(1, gpus=4, config=RECLAIM)
    start_running(s, 0, *[running(f"h{i}", tenant="heavy") for i in range(2)])
    start_running(s, 0, *[running(f"m{i}", tenant="mid") for i in range(2)])
    s.submit(job("l1", tenant="light", gpus=2, submit=2 * HOUR))
    # shares of the 4 GPUs held: light 4/3, heavy 4/3, mid 4/3; light's 2 GPUs exceed its share
    assert not preempts(s.decide(3 * HOUR))


def test_no_reclaim_loop_between_two_tenants():
    s = cluster_of(1, gpus=4, config=RECLAIM)
    start_running(s, 0, *[running(f"h{i}", tenant="heavy") for i in range(4)])
    s.submit(job("l1", tenant="light", submit=HOUR))
    s.submit(job("l2", tenant="light", submit=HOUR))
    total = 0
    now = 3 * HOUR
    for _ in range(24):  # victims stop, preemptors start, the victims come back queued
        for d in preempts(s.decide(now)):
            total += len(d.victim_ids)
            for victim in d.victim_ids:
                gone = s.running[victim]
                s.finish(victim, now + 30)
                s.submit(job(victim, tenant=gone.tenant, submit=0, preemptions=1))
        now += 2 * HOUR
    holders = sorted(j.tenant for j in s.running.values())
    assert holders == ["heavy", "heavy", "light", "light"]  # the fair split, then it stays
    assert total == 2


def test_a_reclaim_victim_keeps_one_preemption_for_higher_tiers():
    s = cluster_of(1, gpus=2, config=RECLAIM)
    start_running(s, 0, running("h0", tenant="heavy"))
    s.submit(job("h1", tenant="heavy", submit=0, preemptions=2))  # the free cap is 3
    s.decide(0)
    s.submit(job("l1", tenant="light", submit=HOUR))
    decisions = s.decide(3 * HOUR)
    [p] = preempts(decisions)
    assert p.victim_ids == ("h0",)
