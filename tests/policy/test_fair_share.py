"""Fair share inside a tier under the default policy: aging capped at the share (issue 18).

An aged job (waited A_T) goes ahead only if its tenant is below its max-min share of its tier
and the job fits in what the tenant lacks of it; the level's oldest job past
`aging_above_share` x A_T (3.5 x 48 h for free) goes first, one at a time, when no job of the
level holds a reservation. So a tenant's long queue earns it no lane ahead of the others.
"""

from apps.scheduling.core.policy import PolicyConfig, default_tiers
from tests.policy.test_policy import cluster_of, job, running, start_running, started

HOUR = 3600.0
FREE_AGE = default_tiers()["free"].age_limit_s  # 48 h


def test_a_10000_job_array_gains_its_tenant_nothing():
    s = cluster_of(1, gpus=8)
    start_running(
        s,
        0,
        *[running(f"a-run{i}", tenant="array", est_end=10 * FREE_AGE) for i in range(4)],
        *[running(f"x{i}", tenant="x", est_end=FREE_AGE + 10_000) for i in range(4)],
    )
    for i in range(10_000):
        s.submit(job(f"a{i}", tenant="array", submit=1 + i / 100_000))
    for i in range(10):
        s.submit(job(f"small{i}", tenant="small", submit=2))
    now = FREE_AGE + 10_000  # every queued job has waited past the free age limit
    for i in range(4):
        s.finish(f"x{i}", now)
    # The array holds 4 GPUs, above its share (2 of the 4 the tier holds): its aged jobs are
    # not lifted, so the small tenant's jobs take the 4 free GPUs.
    assert started(s.decide(now)) == [f"small{i}" for i in range(4)]


def test_without_share_gated_aging_the_array_takes_everything():
    config = PolicyConfig(aging_within_share=False)
    s = cluster_of(1, gpus=8, config=config)
    start_running(
        s,
        0,
        *[running(f"a-run{i}", tenant="array", est_end=10 * FREE_AGE) for i in range(4)],
        *[running(f"x{i}", tenant="x", est_end=FREE_AGE + 10_000) for i in range(4)],
    )
    for i in range(1000):
        s.submit(job(f"a{i}", tenant="array", submit=1 + i / 100_000))
    for i in range(10):
        s.submit(job(f"small{i}", tenant="small", submit=2))
    now = FREE_AGE + 10_000
    for i in range(4):
        s.finish(f"x{i}", now)
    assert started(s.decide(now)) == [f"a{i}" for i in range(4)]


def test_inside_a_tier_the_order_follows_usage_not_queue_length():
    s = cluster_of(1, gpus=4)
    s.set_usage("big", "free", 100 * HOUR * 8, now=0.0)  # 8 GPUs for 100 h, decayed
    for i in range(1000):
        s.submit(job(f"big{i}", tenant="big", submit=1 + i))
    for i in range(10):
        s.submit(job(f"small{i}", tenant="small", submit=2000 + i))
    assert started(s.decide(3000)) == [f"small{i}" for i in range(4)]


def test_a_tenant_above_its_share_still_ages_after_its_longer_limit():
    s = cluster_of(1, gpus=2)
    start_running(s, 0, running("h-run", tenant="heavy", est_end=10 * FREE_AGE))
    start_running(s, 0, running("blocker", tenant="x", est_end=3.6 * FREE_AGE))
    s.submit(job("h-old", tenant="heavy", submit=1))  # heavy holds its whole share
    for i in range(3):
        s.submit(job(f"pro{i}", tier="pro", tenant="p", submit=3.5 * FREE_AGE + i))
    s.finish("blocker", 3.6 * FREE_AGE)  # h-old waited past 3.5 x 48 h: lifted over pro
    assert started(s.decide(3.6 * FREE_AGE)) == ["h-old"]


def test_a_gang_of_a_tenant_above_its_share_ages_at_the_tier_limit():
    def scenario(config=None):
        s = cluster_of(3, gpus=8, config=config)
        start_running(s, 0, running("h-run", tenant="heavy", gpus=8, est_end=10 * FREE_AGE))
        start_running(
            s,
            0,
            running("x0", tenant="x", gpus=8, est_end=FREE_AGE + 1000),
            running("x1", tenant="x", gpus=8, est_end=FREE_AGE + 1000),
        )
        s.submit(job("gang", tenant="heavy", gpus=8, nodes=2, submit=1))
        s.submit(job("pro0", tier="pro", tenant="p", gpus=8, submit=FREE_AGE))
        for name in ("x0", "x1"):
            s.finish(name, FREE_AGE + 1000)
        return started(s.decide(FREE_AGE + 1000))

    # heavy holds its share (8 of the 8 GPUs free holds) but its gang has waited 48 h: with
    # `aging_gangs_at_limit` it is lifted anyway.
    assert scenario(PolicyConfig(aging_gangs_at_limit=True)) == ["gang"]
    # By default (since aging is capped at the share) gangs age with the rest of their
    # tenant's queue: the pro job goes first; the gang waits for its turn or to be overdue.
    assert scenario() == ["pro0"]


def _share_of_starts(queued_by_big: int, config=None, rounds: int = 40) -> dict[str, int]:
    """Two tenants of one tier take turns on a 4-GPU node whose jobs end every 12 h (so the
    queue passes the free tier's 48 h age limit): `big` with `queued_by_big` queued jobs,
    `small` with 10. The starts each tenant got until the small tenant's last one."""
    s = cluster_of(1, gpus=4, config=config)
    for i in range(queued_by_big):
        s.submit(job(f"big{i}", tenant="big", submit=1 + i / 100_000))
    for i in range(10):
        s.submit(job(f"small{i}", tenant="small", submit=2 + i / 100_000))
    starts = {"big": 0, "small": 0}
    for r in range(rounds):
        now = 10 + r * 12 * HOUR
        for d in started(s.decide(now)):
            starts[s.running[d].tenant] += 1
        for job_id in [j for j, run in s.running.items() if run.tenant in starts]:
            s.finish(job_id, now + 12 * HOUR - 1)
        if s.queued and all(q.tenant == "big" for q in s.queued.values()):
            break
    return starts


def test_10000_queued_jobs_gain_their_tenant_no_more_starts_than_10():
    # Until the small tenant's 10 jobs are all started, the two share the node evenly,
    # whether the big tenant queued 10 jobs or 10,000 (its demand counts only up to the water
    # level, queued jobs are not usage, and aging lifts it no further than its share).
    ten, many = _share_of_starts(10), _share_of_starts(10_000)
    assert many == ten
    assert ten["small"] == 10 and abs(ten["big"] - ten["small"]) <= 2
    # The order before issue 18 (every aged job first, oldest first) gave the array the node
    # once its jobs passed 48 h: the small tenant waited behind all 10,000.
    old = _share_of_starts(10_000, PolicyConfig(aging_within_share=False))
    assert old["big"] > 2 * old["small"]


def test_aging_lifts_a_tenant_up_to_its_share_and_no_further():
    # Both tenants' jobs have waited past 48 h; the tier holds nothing yet. The array holds
    # nothing, so its oldest job is lifted, but no more (its share of the tier with that job in
    # it: 0.5 GPU); the rest go by fair share, to the small tenant, which used nothing.
    s = cluster_of(1, gpus=4)
    start_running(
        s, 0, *[running(f"x{i}", tenant="x", est_end=FREE_AGE + 10_000) for i in range(4)]
    )
    for i in range(10_000):
        s.submit(job(f"a{i}", tenant="array", submit=1 + i / 100_000))
    s.set_usage("array", "free", 200 * HOUR * 4, now=0.0)  # it used a lot before
    for i in range(10):
        s.submit(job(f"small{i}", tenant="small", submit=2))
    now = FREE_AGE + 10_000
    for i in range(4):
        s.finish(f"x{i}", now)
    assert started(s.decide(now)) == ["a0", "small0", "small1", "small2"]


def test_overdue_jobs_go_first_one_at_a_time():
    s = cluster_of(1, gpus=3)
    start_running(s, 0, running("h-run", tenant="heavy", est_end=10 * FREE_AGE))
    start_running(s, 0, *[running(f"x{i}", tenant="x", est_end=3.6 * FREE_AGE) for i in range(2)])
    s.submit(job("h-old1", tenant="heavy", submit=1))  # heavy holds its whole share
    s.submit(job("h-old2", tenant="heavy", submit=2))
    for i in range(2):
        s.submit(job(f"pro{i}", tier="pro", tenant="p", submit=3.6 * FREE_AGE - 1000 + i))
    for i in range(2):
        s.finish(f"x{i}", 3.6 * FREE_AGE)
    # Both of heavy's jobs waited past 3.5 x 48 h; only the oldest goes ahead of the pro job
    # (pro, under its guarantee, comes first in the fair-share order).
    assert started(s.decide(3.6 * FREE_AGE)) == ["h-old1", "pro0"]
