"""The dispatcher's direct wake (apps/scheduling/wake.py): while a dispatcher listens, a request
for a pass wakes it through a Redis list instead of sending a Celery message (issue 35's start
latency); while none listens, the request is the Celery message as before, so nothing waits on
a listener that is not there."""

import threading
import time
from types import SimpleNamespace

import pytest

from apps.scheduling import tasks, wake
from apps.scheduling.dispatcher import DispatchResult
from apps.scheduling.redis import shared_client
from tests.unit.test_dispatch_request import sent  # noqa: F401 (a fixture)


def test_a_request_wakes_a_listening_dispatcher_and_sends_no_message(sent):  # noqa: F811
    shared_client().set(wake.LISTENING_KEY, 1, ex=wake.LISTENING_TTL_S)
    for _ in range(5):
        tasks.request_dispatch(after_submit=True)
    assert sent == []
    assert (
        shared_client().llen(wake.WAKE_KEY) == 1
    )  # one wake: the later requests wait for its pass
    assert shared_client().exists(tasks.REQUESTED_KEY)


def test_without_a_listener_the_request_is_a_celery_message(sent):  # noqa: F811
    tasks.request_dispatch()
    assert len(sent) == 1 and not shared_client().exists(wake.WAKE_KEY)


def test_a_listener_runs_the_pass_for_a_wake_and_renews_its_mark(sent, db):  # noqa: F811
    ran = []
    shared_client().lpush(wake.WAKE_KEY, 1)
    assert wake.listen_once(lambda: ran.append(1))
    assert ran == [1] and 0 < shared_client().ttl(wake.LISTENING_KEY) <= wake.LISTENING_TTL_S
    assert not wake.listen_once(lambda: ran.append(1))  # no wake: back after WAIT_S, no pass
    assert ran == [1]


def test_a_failing_pass_does_not_stop_the_listener(sent, db):  # noqa: F811
    def broken():
        raise RuntimeError("a bug in the pass")

    shared_client().lpush(wake.WAKE_KEY, 1)
    assert wake.listen_once(broken)


def test_a_request_reaches_the_pass_through_a_running_listener(sent, monkeypatch):  # noqa: F811
    passes = threading.Semaphore(0)

    def counted():
        passes.release()
        return DispatchResult(free_gpus=1)

    monkeypatch.setattr(tasks.dispatcher, "dispatch_once", counted)
    listener = wake.Listener(tasks.dispatch)
    listener.start()
    try:
        deadline = time.monotonic() + 5
        while not shared_client().exists(wake.LISTENING_KEY) and time.monotonic() < deadline:
            time.sleep(0.01)
        tasks.request_dispatch(after_submit=True)
        assert passes.acquire(timeout=5)
        assert sent == []
    finally:
        listener.stop()
        listener.thread.join(timeout=wake.WAIT_S + 2)
    assert not listener.thread.is_alive()
    assert not shared_client().exists(tasks.REQUESTED_KEY)  # the pass took the mark
    tasks.request_dispatch()  # stopped: LISTENING_KEY went with it, so a message again
    assert len(sent) == 1


@pytest.mark.parametrize(("queues", "listens"), [({"control": object()}, True),
                                                 ({"webhooks": object()}, False)])  # fmt: skip
def test_only_a_worker_on_the_control_queue_listens(monkeypatch, queues, listens):
    started = []
    monkeypatch.setattr(wake.Listener, "start", lambda self: started.append(self))
    worker = SimpleNamespace(
        app=SimpleNamespace(amqp=SimpleNamespace(queues=SimpleNamespace(consume_from=queues)))
    )
    try:
        tasks._listen(sender=worker)
        assert bool(started) == listens
    finally:
        wake._listener.clear()
