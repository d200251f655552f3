"""The dispatcher's direct wake (issue 35's start latency): a thread in each dispatcher process
blocks on a Redis list, and a request for a pass (tasks.request_dispatch) pushes onto that list
instead of sending a Celery message while some dispatcher listens.

A Celery message cost the web ~2 ms of CPU to publish, and the dispatcher its receipt, the
unacked bookkeeping of a late ack and three task events before the pass began: 10-20 ms of the
~35 ms from a submit's commit to its placement on this project's 2-core bench machine. The wake
is one Redis command each side; the pass is the same task body (`tasks.dispatch`: the leader
lock, the dirty mark, the same pass).

Nothing is lost by it: LISTENING_KEY lives LISTENING_TTL_S and each listener renews it every
WAIT_S, so while no dispatcher listens (none started, or every listener dead or busy in a long
pass) requests are Celery messages as before; a wake that nobody takes is answered as a lost
message is, by the beat's tick (and REQUESTED_TTL_S holds back the next request at most that
long)."""

from __future__ import annotations

import logging
import threading

import redis
from django.db import close_old_connections

from apps.platform.names import Queue

from .redis import client

log = logging.getLogger(__name__)

WAKE_KEY = "gpuplatform:dispatch:wake"
LISTENING_KEY = "gpuplatform:dispatch:listening"
WAIT_S = 1  # a listener renews LISTENING_KEY at least this often while idle
LISTENING_TTL_S = 3


def listen_once(run) -> bool:
    """Mark this process listening, wait up to WAIT_S for a wake, and run the pass for it.
    True when a wake came."""
    client().set(LISTENING_KEY, 1, ex=LISTENING_TTL_S)
    if not client().blpop([WAKE_KEY], timeout=WAIT_S):
        return False
    close_old_connections()  # as Celery's Django fixup does around each task
    try:
        run()
    except Exception:
        log.exception("dispatch pass failed (woken); the next request or tick runs another")
    finally:
        close_old_connections()
    return True


class Listener:
    def __init__(self, run):
        self.run, self.stopped = run, threading.Event()
        self.thread = threading.Thread(target=self._loop, name="dispatch-wake", daemon=True)

    def start(self) -> None:
        self.thread.start()

    def _loop(self) -> None:
        while not self.stopped.is_set():
            try:
                listen_once(self.run)
            except redis.RedisError:
                self.stopped.wait(WAIT_S)  # requests go to Celery once LISTENING_KEY lapses

    def stop(self) -> None:
        self.stopped.set()
        try:
            client().delete(LISTENING_KEY)  # requests go to Celery now, not LISTENING_TTL_S later
        except redis.RedisError:
            pass


_listener: list[Listener] = []


def start(worker, run) -> None:
    """At a worker's start (tasks.py connects it to `worker_ready`): a listener that runs `run`
    for each wake, in a worker that consumes the control queue (a dispatcher) only."""
    amqp = getattr(getattr(worker, "app", None), "amqp", None)
    if amqp is None or Queue.CONTROL not in amqp.queues.consume_from:
        return
    listener = Listener(run)
    listener.start()
    _listener.append(listener)


def stop() -> None:
    """At a worker's warm shutdown (tasks.py connects it to `worker_shutting_down`)."""
    while _listener:
        _listener.pop().stop()
