"""The start-estimate replay (apps/scheduling/core/estimate.py) on small hand-made pools."""

from apps.scheduling.core.estimate import Replay, Waiting, estimate_starts


def test_jobs_start_in_queue_order_as_the_gpus_ahead_of_them_free_up():
    # 8 GPUs, all held by one job until t=600. Then 6 start, the 4-GPU job waits for them (no
    # backfill), and the 2-GPU job starts with it: nothing starts before a job ahead of it.
    queue = [Waiting("a", 6, 300), Waiting("b", 4, 100), Waiting("c", 2, 100)]
    assert estimate_starts(0.0, 8, [(600.0, 8)], queue) == {"a": 600.0, "b": 900.0, "c": 900.0}


def test_free_gpus_start_a_job_now_and_the_earliest_ends_are_released_first():
    held = [(500.0, 2), (100.0, 2), (300.0, 2)]  # 2 of 8 GPUs free now
    queue = [Waiting("now", 2, 50), Waiting("two", 4, 1000), Waiting("three", 2, 10)]
    # "now" takes the 2 free GPUs; "two" needs 4: "now"'s end at 50 and the end at 100 give back
    # 2 + 2; "three" then waits for the next end, at 300.
    starts = estimate_starts(0.0, 8, held, queue)
    assert starts["now"] == 0.0
    assert starts["two"] == 100.0
    assert starts["three"] == 300.0


def test_a_job_larger_than_the_pool_gets_no_estimate_and_does_not_block_the_rest():
    starts = estimate_starts(0.0, 8, [], [Waiting("huge", 16, 10), Waiting("small", 1, 10)])
    assert starts == {"small": 0.0}


def test_an_end_already_past_counts_as_now():
    assert estimate_starts(1000.0, 4, [(10.0, 4)], [Waiting("x", 4, 1)]) == {"x": 1000.0}


def test_no_estimate_when_not_enough_gpus_will_ever_be_free():
    # Capacity shrank under running jobs: 4 GPUs in the pool, 6 held (ending), a 4-GPU job fits
    # once they end; a pool that holds more than it has never frees enough for more.
    assert estimate_starts(0.0, 4, [(50.0, 6)], [Waiting("x", 4, 1)]) == {"x": 50.0}
    replay = Replay(capacity=4, t=0.0, free=1, releases=[])
    assert dict(replay.starts([Waiting("x", 2, 1), Waiting("y", 1, 1)])) == {"y": 0.0}


def test_a_replay_goes_on_with_jobs_queued_later_as_if_replayed_at_once():
    held, first, later = (
        [(200.0, 4)],
        [Waiting("a", 4, 100)],
        [Waiting("b", 8, 50), Waiting("c", 2, 5)],
    )
    replay = Replay.start(0.0, 8, held)
    starts = dict(replay.starts(first))
    kept = replay.copy()
    starts |= dict(replay.starts(later))
    assert (
        starts == estimate_starts(0.0, 8, held, first + later) == {"a": 0.0, "b": 200.0, "c": 250.0}
    )
    assert dict(kept.starts([Waiting("d", 8, 1)])) == {"d": 200.0}  # the copy did not advance


def test_starts_is_lazy_so_a_caller_can_stop_at_its_job():
    def queue():
        yield Waiting("a", 1, 10)
        raise AssertionError("read past the job asked for")

    assert next(Replay.start(0.0, 1, []).starts(queue())) == ("a", 0.0)
