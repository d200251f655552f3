"""At most one dispatch request waits at a time (apps/scheduling/tasks.py request_dispatch):
later requests are answered by the waiting one's pass, which deletes the mark before it reads
the queue; a request that could not be sent does not hold back the next. After a futile pass (a
full cluster, nothing placed), the next pass waits QUIET_MS and answers every submit made
meanwhile; a job's end or a node change ends the wait, and a submit when a GPU is free never
waits (tests/unit/test_h40disp_quiet.py has the waits themselves)."""

import time

import pytest
import redis

from apps.scheduling import tasks, wake
from apps.scheduling.dispatcher import DispatchResult, dispatch_once
from apps.scheduling.redis import LeaderLock, shared_client
from tests.factories import make_cast, make_node
from tests.unit.test_dispatcher import submit


@pytest.fixture
def sent(monkeypatch):
    keys = (
        tasks.REQUESTED_KEY,
        tasks.URGENT_KEY,
        wake.LISTENING_KEY,
        wake.WAKE_KEY,
    )
    shared_client().delete(*keys)
    monkeypatch.setattr(tasks._Quiet, "until", float("-inf"))
    messages = Sent()
    monkeypatch.setattr(tasks.dispatch, "apply_async", lambda **options: messages.append(options))
    passes = [DispatchResult(free_gpus=1)]  # the result of each pass from here on
    monkeypatch.setattr(tasks.dispatcher, "dispatch_once", lambda: passes[-1])
    messages.passes = passes
    yield messages
    shared_client().delete(*keys)


class Sent(list):
    passes: list


def test_requests_while_one_waits_send_nothing_more(sent):
    for _ in range(5):
        tasks.request_dispatch()
    assert len(sent) == 1
    assert 0 < shared_client().ttl(tasks.REQUESTED_KEY) <= tasks.REQUESTED_TTL_S


def test_the_pass_takes_the_mark_so_a_later_request_is_sent(sent):
    tasks.request_dispatch()
    tasks.dispatch()  # the waiting request's task: deletes the mark, then runs its pass
    assert not shared_client().exists(tasks.REQUESTED_KEY)
    tasks.request_dispatch()
    assert len(sent) == 2


def test_a_request_that_could_not_be_sent_leaves_no_mark(sent, monkeypatch):
    def broker_down(**options):
        raise ConnectionError("broker down")

    monkeypatch.setattr(tasks.dispatch, "apply_async", broker_down)
    tasks.request_dispatch()  # logs, does not raise
    assert not shared_client().exists(tasks.REQUESTED_KEY)


def test_without_redis_the_request_is_sent_anyway(sent, monkeypatch):
    class Down:
        def set(self, *args, **kwargs):
            raise redis.ConnectionError("down")

        eval = set

    monkeypatch.setattr(tasks, "shared_client", lambda: Down())
    tasks.request_dispatch()
    tasks.request_dispatch()
    assert len(sent) == 2


def test_after_a_futile_pass_submits_send_one_request_and_an_end_marks_the_wait_over(sent):
    sent.passes.append(DispatchResult(free_gpus=0))  # full cluster, nothing placed
    tasks.dispatch()
    assert 0 < tasks._Quiet.until - time.monotonic() <= tasks.QUIET_MS / 1000
    for _ in range(5):
        tasks.request_dispatch(after_submit=True)
    assert len(sent) == 1 and "countdown" not in sent[0]  # the pass waits, not the message
    assert not shared_client().exists(tasks.URGENT_KEY)
    tasks.request_dispatch()  # a job ended: answered by the same pass, which must not wait
    assert len(sent) == 1 and shared_client().llen(tasks.URGENT_KEY) == 1
    sent.passes.append(DispatchResult(placed=["j"]))  # that pass placed: the wait is over
    tasks.dispatch()
    assert tasks._Quiet.until < time.monotonic() and not shared_client().exists(tasks.URGENT_KEY)
    tasks.request_dispatch(after_submit=True)
    assert len(sent) == 2


def test_a_submit_to_a_cluster_with_a_free_gpu_never_waits(sent):
    sent.passes.append(DispatchResult(free_gpus=1))  # placed nothing (say, too big), a GPU free
    tasks.dispatch()
    assert tasks._Quiet.until < time.monotonic()
    tasks.request_dispatch(after_submit=True)
    assert len(sent) == 1 and "countdown" not in sent[0]


def test_a_pass_that_fills_the_cluster_is_not_futile_and_the_next_one_is(db):
    cast = make_cast()
    make_node("h1", gpus=1)
    submit(cast), submit(cast)
    first = dispatch_once()  # places one on the free GPU
    assert first.placed and first.free_gpus == 1 and not first.futile
    second = dispatch_once()  # the other waits; no GPU free
    assert not second.placed and second.free_gpus == 0 and second.futile


def test_a_task_that_finds_the_lock_held_leaves_the_request_waiting_for_the_holders_pass(sent):
    holder = LeaderLock("dispatch", ttl_ms=tasks.LEADER_TTL_MS)
    assert holder.acquire()  # a pass runs
    try:
        tasks.request_dispatch()
        tasks.dispatch()  # that request's task: the lock is held, it marks the holder dirty
        assert shared_client().exists(tasks.DIRTY_KEY, tasks.REQUESTED_KEY) == 2
        for _ in range(3):
            tasks.request_dispatch()  # answered by the holder's next pass: no message each
        assert len(sent) == 1
    finally:
        holder.release()
        shared_client().delete(tasks.DIRTY_KEY)


def test_the_holder_goes_again_for_a_mark_made_just_before_it_lets_go(sent, monkeypatch):
    ran = []
    monkeypatch.setattr(tasks, "_timed_pass", lambda: ran.append(1))
    release = LeaderLock.release

    def marked_then_released(lock):
        if len(ran) == 1:  # a request's task found the lock held after the holder's last look
            shared_client().set(tasks.DIRTY_KEY, 1)
        release(lock)

    monkeypatch.setattr(LeaderLock, "release", marked_then_released)
    tasks.dispatch()
    assert len(ran) == 2 and not shared_client().exists(tasks.DIRTY_KEY)


def test_a_task_hands_on_to_a_new_message_after_its_passes(sent, monkeypatch):
    ran = []

    def pass_with_requests():
        ran.append(1)
        shared_client().set(tasks.DIRTY_KEY, 1)  # requests never stop coming

    monkeypatch.setattr(tasks, "_timed_pass", pass_with_requests)
    tasks.dispatch()
    assert len(ran) == tasks.PASSES_PER_TASK and len(sent) == 1
    shared_client().delete(tasks.DIRTY_KEY)
