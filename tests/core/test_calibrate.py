"""The calibrator (apps/scheduling/core/calibrate.py): the plan's wait scaled by the ratios of
actual to planned wait of earlier jobs, learned online as they start; and the arrivals a plan
can expect (core/forecast.py `expected_arrivals`)."""

import random

from apps.scheduling.core.calibrate import MIN_SAMPLES, Calibrator, bucket, survival_quantiles
from apps.scheduling.core.forecast import expected_arrivals, forecast
from apps.scheduling.core.policy import QueuedJob, default_tiers
from tests.core.test_forecast import NOW, scene


def test_no_estimate_until_enough_planned_jobs_started():
    calibrator = Calibrator()
    for i in range(MIN_SAMPLES - 1):
        calibrator.planned(f"j{i}", "free", 0.0, 600.0)
        calibrator.started(f"j{i}", 1200.0)
    assert calibrator.estimate("free", 0.0, 600.0) is None
    calibrator.planned("last", "free", 0.0, 600.0)
    calibrator.planned("last", "free", 0.0, 10.0)  # the first plan is the one that counts
    calibrator.started("last", 1200.0)
    got = calibrator.estimate("free", 5000.0, 5300.0)
    assert got is not None and got.start == got.earliest == got.latest == 5000.0 + 2 * 300.0
    assert calibrator.open_jobs() == []


def test_the_window_covers_the_share_of_starts_its_quantiles_promise():
    # Actual waits are the planned wait times a log-normal factor: about 80% of new starts fall
    # in the window of the 0.1 and 0.9 quantiles, and the estimate is the bias-corrected wait.
    rng = random.Random(3)
    calibrator, inside, n = Calibrator(), 0, 0
    for i in range(3000):
        planned = rng.choice([300.0, 1800.0, 7200.0])
        actual = planned * 1.8 * rng.lognormvariate(0, 0.5)
        got = calibrator.estimate("free", 0.0, planned)
        if got is not None and i > 500:
            n += 1
            inside += got.earliest <= actual <= got.latest
        calibrator.planned(f"j{i}", "free", 0.0, planned)
        calibrator.started(f"j{i}", actual)
    assert 0.75 <= inside / n <= 0.85
    # The estimate is the plan's own start where the window holds it, else the window's edge.
    middle = calibrator.estimate("free", 0.0, 1800.0)
    assert middle is not None and middle.earliest < 1800.0 == middle.start < middle.latest
    early = calibrator.estimate("free", 0.0, 300.0)
    assert early is not None and early.start == early.earliest > 300.0


def test_buckets_by_tier_and_planned_wait_fall_back_to_the_same_wait_of_every_tier():
    assert [bucket(w) for w in (0, 200, 300, 1000, 4000, 20000, 80000, 10**7)] == [
        0, 0, 1, 2, 3, 4, 5, 5,
    ]  # fmt: skip
    calibrator = Calibrator(min_samples=2)
    for i in range(2):
        calibrator.planned(f"p{i}", "pro", 0.0, 3600.0)
        calibrator.started(f"p{i}", 3 * 3600.0)
        calibrator.planned(f"s{i}", "pro", 0.0, 60.0)
        calibrator.started(f"s{i}", 60.0)
    free = calibrator.estimate("free", 0.0, 3600.0)  # free has none: every tier's hour-long plans
    assert free is not None and free.start == 3 * 3600.0
    short = calibrator.estimate("pro", 0.0, 30.0)
    assert short is not None and short.start == 60.0
    calibrator.planned("gone", "pro", 0.0, 60.0)
    calibrator.forget("gone")
    assert calibrator.open_jobs() == []


def test_jobs_still_waiting_count_as_waits_of_at_least_their_time_so_far():
    # 40 jobs planned to wait 10 minutes: the 10 that started waited 15, the 30 others still
    # wait 2 hours on. Judged by the starts alone every wait is 1.5x the plan; counted as
    # censored (Kaplan-Meier), the still-waiting jobs stretch the window past their 12x.
    calibrator = Calibrator()
    for i in range(40):
        calibrator.planned(f"j{i}", "free", 0.0, 600.0)
    for i in range(10):
        calibrator.started(f"j{i}", 900.0)
    got = calibrator.estimate("free", 7200.0, 7800.0)
    assert got is not None and got.latest >= 7200.0 + 12 * 600.0
    assert got.earliest == got.start == 7200.0 + 1.5 * 600.0  # the 0.1 quantile: the starts seen
    # Once they start, their true waits are the history.
    for i in range(10, 40):
        calibrator.started(f"j{i}", 7200.0)
    later = calibrator.estimate("free", 9000.0, 9600.0)
    assert later is not None and later.latest == 9000.0 + 12 * 600.0


def test_survival_quantiles_match_kaplan_meier():
    # Starts at 1, 2, 3, 4; one waiting since ratio 2.5 leaves 2 at risk at 3: F(3) = 1 - 3/5 *
    # 1/2 = 0.7, F(4) = 1. Without the waiting one: the plain empirical quantiles.
    seen = [(1.0, True), (2.0, True), (2.5, False), (3.0, True), (4.0, True)]
    assert survival_quantiles(seen, (0.2, 0.4, 0.7, 0.75)) == [1.0, 2.0, 3.0, 4.0]
    assert survival_quantiles([(r, True) for r in (1.0, 2.0, 3.0, 4.0)], (0.5,)) == [2.0]
    assert survival_quantiles([(1.0, True), (5.0, False)], (0.1, 0.9)) == [1.0, 5.0]


def test_expected_arrivals_repeat_the_recent_window_and_take_their_place_in_the_plan():
    recent = [QueuedJob(f"r{i}", "acme", "enterprise", 8, NOW - 3000 + 1000 * i, 3600)
              for i in range(3)]  # fmt: skip
    came = expected_arrivals(NOW, recent, 3600.0, 3 * 3600.0, max_jobs=5)
    assert [job.submit - NOW for job in came] == [600.0, 1600.0, 2600.0, 4200.0, 5200.0]
    assert len({job.job_id for job in came}) == 5 and came[0].tier == "enterprise"
    assert expected_arrivals(NOW, recent, 0.0, 3600.0, 5) == []
    # A free job behind the running one: alone it starts when that ends (at +600); an enterprise
    # job expected at +300 goes first and the free job starts only when that one ends.
    cluster, running = scene()
    free = [QueuedJob("f", "solo", "free", 8, NOW - 10, 3600)]

    def starts(expected):
        plan = forecast(NOW, cluster, free, running, default_tiers(),
                        end_of=lambda job: NOW + 600, runtime_of=lambda job: 900,
                        expected=expected)  # fmt: skip
        return plan.starts

    assert starts([]) == {"f": NOW + 600}
    boss = QueuedJob("e", "acme", "enterprise", 8, NOW + 300, 3600)
    assert starts([boss]) == {"f": NOW + 1500}
