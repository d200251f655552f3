"""Fair share inside a tier under the default policy: share-gated aging (issue 18).

A tenant at or above its max-min share of its tier ages after `aging_above_share` x A_T
(3.5 x 48 h for free), its gangs after A_T; a tenant below it after A_T. So a tenant's long
queue earns it no lane ahead of the others.
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

    # heavy holds its share (8 of the 8 GPUs free holds) but its gang has waited 48 h.
    assert scenario() == ["gang"]
    # Gangs aged with the rest of their tenant's queue: the pro job goes first.
    assert scenario(PolicyConfig(aging_gangs_at_limit=False)) == ["pro0"]
