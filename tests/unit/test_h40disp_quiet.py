"""After a futile pass the dispatcher itself waits QUIET_MS before its next pass
(apps/scheduling/tasks.py `_wait_while_quiet`): every submit made meanwhile, during the futile
pass too, is answered by that one pass, each submit's request is one Redis round trip and no
delayed Celery message is sent; a request that must not wait (a job's end, a node change) ends
the wait at once."""

import threading
import time

import pytest

from apps.scheduling import tasks, wake
from apps.scheduling.dispatcher import DispatchResult
from apps.scheduling.redis import shared_client

FUTILE, PLACED = DispatchResult(free_gpus=0), DispatchResult(placed=["j"])


KEYS = (tasks.REQUESTED_KEY, tasks.URGENT_KEY, tasks.DIRTY_KEY, wake.LISTENING_KEY, wake.WAKE_KEY)


def clean_requests(monkeypatch) -> list[dict]:
    """A clean slate for the dispatch requests' keys and this process's quiet; the Celery
    messages that would be sent, recorded (the list) instead."""
    shared_client().delete(*KEYS)
    monkeypatch.setattr(tasks._Quiet, "until", float("-inf"))
    messages: list[dict] = []
    monkeypatch.setattr(tasks.dispatch, "apply_async", lambda **options: messages.append(options))
    return messages


@pytest.fixture
def passes(monkeypatch):
    """Each pass's start (monotonic) and what it does first; the passes' results in turn."""
    record = Passes(clean_requests(monkeypatch))

    def one_pass():
        record.started.append(time.monotonic())
        during = record.during.pop(0) if record.during else None
        if during:
            during()
        return record.results.pop(0) if record.results else FUTILE

    monkeypatch.setattr(tasks.dispatcher, "dispatch_once", one_pass)
    yield record
    shared_client().delete(*KEYS)


class Passes:
    def __init__(self, messages):
        self.messages, self.started, self.results, self.during = messages, [], [], []


def listening():
    shared_client().set(wake.LISTENING_KEY, 1, ex=wake.LISTENING_TTL_S)


def test_submits_during_a_futile_pass_wait_with_the_rest_for_one_pass(passes):
    listening()

    def submits():  # while the futile pass runs: their requests, then the woken task
        for _ in range(5):
            tasks.request_dispatch(after_submit=True)
        tasks.dispatch()  # the listener's task for the wake: the lock is held, it marks

    passes.during = [submits]
    began = time.monotonic()
    tasks.dispatch()
    assert len(passes.started) == 2
    assert passes.started[1] - passes.started[0] >= tasks.QUIET_MS / 1000 * 0.8
    assert passes.messages == [] and time.monotonic() - began < 5


def test_submits_during_the_quiet_send_nothing_but_one_wake(passes):
    tasks.dispatch()  # futile: a quiet begins
    listening()
    for _ in range(5):
        tasks.request_dispatch(after_submit=True)
    assert passes.messages == [] and shared_client().llen(wake.WAKE_KEY) == 1
    assert not shared_client().exists(tasks.URGENT_KEY)


def test_a_request_that_must_not_wait_ends_the_wait(passes):
    tasks.dispatch()  # futile
    tasks._Quiet.until = time.monotonic() + 5  # a long quiet, so the end shows
    tasks.request_dispatch(after_submit=True)
    holder = threading.Thread(target=tasks.dispatch)
    began = time.monotonic()
    holder.start()
    time.sleep(0.2)
    assert len(passes.started) == 1  # still waiting
    tasks.request_dispatch()  # a job ended
    holder.join(timeout=10)
    assert len(passes.started) == 2 and passes.started[1] - began < 2.5


def test_an_urgent_request_made_during_a_pass_is_not_made_to_wait(passes):
    listening()

    def a_job_ends():
        tasks.request_dispatch()
        tasks.dispatch()

    passes.during = [a_job_ends]
    tasks._Quiet.until = time.monotonic() + 5  # as a futile pass before it left it
    began = time.monotonic()
    shared_client().lpush(tasks.URGENT_KEY, 1)  # the first pass's own cause
    tasks.dispatch()
    assert len(passes.started) == 2 and time.monotonic() - began < 2.5


def test_no_wait_after_a_pass_that_placed(passes):
    passes.results = [PLACED]
    tasks.dispatch()
    assert tasks._Quiet.until < time.monotonic()
    began = time.monotonic()
    tasks.dispatch()
    assert passes.started[1] - began < tasks.QUIET_MS / 1000 / 2
