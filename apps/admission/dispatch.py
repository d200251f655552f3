"""The dispatch request after a submission, coalesced per web process.

Each request is a Celery message (plus its task-sent event for Flower): under a burst of
submissions that publishing was a fifth of a submit's time, and every request after the first
few is redundant, since one dispatcher pass reads the whole queue. The rule here keeps the
guarantee that matters: a pass is requested *after* every admitted job's commit. The first
submission in a quiet spell requests one at once; one that comes within WINDOW of the last
request schedules a single request for the end of that window (later ones in the window join
it). So a job waits at most WINDOW longer for its pass, and a process sends at most 1/WINDOW
requests a second. If the process dies before a scheduled request goes out, the dispatcher's
beat tick places the job (GPUPLATFORM_DISPATCH_TICK_SECONDS).
"""

from __future__ import annotations

import threading
import time

from django.db import transaction

WINDOW = 0.05  # seconds

_lock = threading.Lock()
_scheduled = False  # a request is due and has not been sent yet
_last = float("-inf")  # monotonic time of the last request sent


def _send() -> None:
    from apps.scheduling.tasks import request_dispatch

    request_dispatch()


def _fire() -> None:
    global _scheduled, _last
    with _lock:
        _scheduled, _last = False, time.monotonic()
    _send()


def request_soon() -> None:
    """Called once a submission has committed."""
    global _scheduled, _last
    now = time.monotonic()
    with _lock:
        if _scheduled:
            return  # the request due at the end of the window is sent after this commit
        if now - _last >= WINDOW:
            _last = now
            send_now = True
        else:
            _scheduled, send_now = True, False
            timer = threading.Timer(_last + WINDOW - now, _fire)
            timer.daemon = True
            timer.start()
    if send_now:
        _send()


def after_commit() -> None:
    """Inside the submission's transaction: request a pass once it commits."""
    transaction.on_commit(request_soon)
