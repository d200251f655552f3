"""The dispatch request after a submission (apps/admission/dispatch.py): coalesced per process,
always sent after the commit that asked for it, and never by the submission itself."""

import random
import threading
import time

import pytest

from apps.admission import dispatch

senders: set[str] = set()  # names of the threads that sent them


@pytest.fixture
def sends(monkeypatch):
    """The moments (monotonic) at which a dispatch request went out; a fresh coalescing state."""
    sent: list[float] = []
    lock = threading.Lock()

    def record():
        with lock:
            sent.append(time.monotonic())
            senders.add(threading.current_thread().name)

    monkeypatch.setattr(dispatch, "_send", record)
    time.sleep(dispatch.WINDOW * 2)  # whatever an earlier test left due goes out to the old _send
    with dispatch._cond:
        dispatch._due, dispatch._last = False, float("-inf")
    senders.clear()
    return sent


def settle():
    time.sleep(dispatch.WINDOW * 4)


def test_the_first_request_goes_at_once_and_a_burst_becomes_one_more(sends):
    dispatch.request_soon()
    deadline = time.monotonic() + 5
    while not sends and time.monotonic() < deadline:
        time.sleep(0.001)
    assert len(sends) == 1  # no window waited for (a loaded machine may take a while to run it)
    assert senders == {"dispatch-request"}  # by the sender: the submission does not wait for it
    for _ in range(50):
        dispatch.request_soon()
    asked = time.monotonic()
    assert len(sends) == 1
    settle()
    assert len(sends) == 2 and sends[1] >= asked


def test_every_request_is_followed_by_a_send_under_concurrency(sends):
    asks: list[float] = []
    lock = threading.Lock()

    def submitter():
        for _ in range(40):
            time.sleep(random.uniform(0, dispatch.WINDOW / 4))
            dispatch.request_soon()
            with lock:
                asks.append(time.monotonic())

    threads = [threading.Thread(target=submitter) for _ in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    settle()
    assert sends and max(sends) >= max(asks)  # nothing asked for is left without a pass
    # 240 asks over at least 40 x WINDOW/8 seconds: coalesced to about one send a window.
    assert len(sends) <= 240 / 4
    gaps = [b - a for a, b in zip(sends, sends[1:], strict=False)]
    assert min(gaps) >= dispatch.WINDOW * 0.9


def test_bursts_reuse_one_sender_thread(sends, monkeypatch):
    started = []
    start = threading.Thread.start

    def counting_start(thread):
        started.append(thread.name)
        return start(thread)

    monkeypatch.setattr(threading.Thread, "start", counting_start)
    for _ in range(3):
        for _ in range(5):
            dispatch.request_soon()
        settle()
    # Each burst: one at once, and one at the end of its window for those that asked after
    # it went (none where the burst asked before the sender thread ran).
    assert 3 <= len(sends) <= 6
    assert len(started) <= 1  # no thread (Timer) per window
