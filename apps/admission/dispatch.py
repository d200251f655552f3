"""The dispatch request after a submission, coalesced per web process, and sent off the
submission's path.

Each request is a Celery message (with a task-sent event for Flower until 2026-12-04): under a burst of
submissions that publishing was a fifth of a submit's time, and every request after the first
few is redundant, since one dispatcher pass reads the whole queue. The rule here keeps the
guarantee that matters: a pass is requested *after* every admitted job's commit. The first
submission in a quiet spell has one requested at once; one that comes within WINDOW of the last
request marks a single request due at the end of that window (later ones in the window join
it). So a job waits at most WINDOW longer for its pass, and a process sends at most 1/WINDOW
requests a second. If the process dies before a due request goes out, the dispatcher's beat
tick places the job (GPUPLATFORM_DISPATCH_TICK_SECONDS).

Every request is sent by one sender thread per process, started on first need and woken
through a condition: a submission's answer never waits for Redis (SET NX of the request's key,
and the Celery message when there is none: 0.3 to 2 ms, most of it waiting, and the first
submission of a quiet spell paid it in full), and a submission never starts a thread but the
process's first (a `threading.Timer` per window did, and starting a thread waits for it to run,
a GIL hand-off in the middle of a request).
"""

from __future__ import annotations

import os
import threading
import time

from django.db import transaction

from apps.platform import events

WINDOW = 0.05  # seconds

_cond = threading.Condition()
_due = False  # a request must go out after the commits that asked for it
_last = float("-inf")  # monotonic time of the last request sent
_sender: threading.Thread | None = None


def _send() -> None:
    # Already after the commits that asked: delivered now (the scheduler's handler sends the
    # request), not through on_commit, which would open a database connection in the sender
    # thread only to find no transaction there.
    events.deliver(events.DispatchWanted(after_submit=True))


def _run_sender() -> None:
    global _due, _last
    while True:
        with _cond:
            while not _due:
                _cond.wait()
            wait = _last + WINDOW - time.monotonic()
        if wait > 0:
            time.sleep(wait)
        with _cond:
            # A commit that asks from here on finds nothing due and asks again: the request
            # below may already be on its way.
            _due, _last = False, time.monotonic()
        try:
            _send()
        except Exception:  # the handlers log their own failures; the thread must live on
            pass


def _ensure_sender() -> None:
    """Under _cond."""
    global _sender
    if _sender is None or not _sender.is_alive():
        _sender = threading.Thread(target=_run_sender, name="dispatch-request", daemon=True)
        _sender.start()


def request_soon() -> None:
    """Called once a submission has committed: the sender thread sends a request after it."""
    global _due
    with _cond:
        if _due:
            return  # the request due is sent after this commit: the sender clears it first
        _due = True
        _ensure_sender()
        _cond.notify()


def after_commit() -> None:
    """Inside the submission's transaction: request a pass once it commits."""
    transaction.on_commit(request_soon)


def _after_fork() -> None:
    # A forked child has no sender thread, and the condition may have been held by another
    # thread of the parent at the fork.
    global _cond, _due, _last, _sender
    _cond, _due, _last, _sender = threading.Condition(), False, float("-inf"), None


os.register_at_fork(after_in_child=_after_fork)
