"""Thin Celery tasks of the dispatcher: each takes nothing or ids, and calls one service."""

import logging
import time
from typing import cast

import redis
from celery import shared_task, signals

from apps.platform.names import Queue, Task

from . import dispatcher, kept, reconcile, wake
from .figures import record_dispatch_pass
from .redis import LeaderLock, client, shared_client

log = logging.getLogger(__name__)
DIRTY_KEY = "gpuplatform:dispatch:dirty"
# A leader killed mid-pass holds the lock until it lapses: this bounds the takeover (plus one
# beat tick). The holder renews it between passes; a single pass longer than this may overlap
# another dispatcher's, which is safe (the job's guarded update and the allocation index).
LEADER_TTL_MS = 5_000


REQUESTED_KEY = "gpuplatform:dispatch:requested"
# A request whose message was lost (a broker restart, a dead worker) holds back the next ones at
# most this long; the beat tick places the jobs meanwhile.
REQUESTED_TTL_S = 5


# After a futile pass (nothing placed or preempted, no GPU free: DispatchResult.futile), the
# process's next pass waits up to this long (`_wait_while_quiet`), and answers every submit made
# meanwhile: a burst of submits to a full cluster ran up to 40 passes a second over the growing
# queue, none of which could start anything. A job end or a node change (URGENT_KEY) ends the wait
# at once, and a pass that is not futile ends the quiet; a submit to a cluster with a free GPU
# never waits. The dispatcher waits, not the request: a request is one Redis round trip whatever
# the cluster (it was a read of a quiet key in Redis, then a SET NX and, once per wait, a delayed
# Celery message with its receipt and task events on the dispatcher), and the submits made during
# the futile pass wait with the rest instead of running a second pass at once (one pass per wait,
# not two). The quiet is the process's own (no Redis command a pass): a second dispatcher process
# that has not had a futile pass itself runs its pass at once, so with two a burst may run up to
# two passes per QUIET_MS.
QUIET_MS = 250


class _Quiet:
    until = float("-inf")  # monotonic: the end of the wait after this process's futile pass


# A list, pushed by every request that must not wait (not a submit's): a waiting holder blocks on
# it. Deleted before each pass reads the queue, as REQUESTED_KEY is; one left after a pass says a
# request came during that pass, and ends the next wait at once.
URGENT_KEY = "gpuplatform:dispatch:urgent"


# One round trip: for a request that must not wait, its mark on URGENT_KEY (whatever else waits);
# then the request's mark (SET NX, as before), then a wake pushed for a dispatcher that listens
# (apps/scheduling/wake.py), the lists kept to one: 0 another request waits, 1 no dispatcher
# listens (send the Celery message), 2 woken.
_REQUEST = """
if ARGV[2] == '1' then
  redis.call('lpush', KEYS[4], 1)
  redis.call('ltrim', KEYS[4], 0, 0)
  redis.call('expire', KEYS[4], ARGV[1])
end
if not redis.call('set', KEYS[1], 1, 'NX', 'EX', ARGV[1]) then return 0 end
if redis.call('exists', KEYS[2]) == 0 then return 1 end
redis.call('lpush', KEYS[3], 1)
redis.call('ltrim', KEYS[3], 0, 0)
return 2
"""
_SEND = 1


def request_dispatch(after_submit: bool = False) -> None:
    """Ask for a dispatcher pass; called on commit of every submit, finish and node change.

    At most one request waits at a time: a request sets REQUESTED_KEY (SET NX) and wakes a
    listening dispatcher (apps/scheduling/wake.py) or, while none listens, sends the Celery
    message, only if it was not set, and the dispatcher deletes the key before its next
    pass reads the queue (`dispatch`). So a request that finds the key set is answered by a
    pass that starts after it (every caller asks after its commit). Under
    a burst of submissions, publishing a message each (~2 ms of a web process's CPU) was a tenth
    of a submit's cost, for passes that the dispatcher would have run once anyway.

    `after_submit` (new jobs only): the pass may wait out a futile pass's quiet (QUIET_MS); any
    other request marks URGENT_KEY, which ends that wait."""
    urgent = "0" if after_submit else "1"
    try:
        keys = (REQUESTED_KEY, wake.LISTENING_KEY, wake.WAKE_KEY, URGENT_KEY)
        marked = int(cast(int, shared_client().eval(_REQUEST, len(keys), *keys,
                                                     str(REQUESTED_TTL_S), urgent)))  # fmt: skip
        if marked != _SEND:  # another request waits, or a dispatcher listening was woken
            return
    except redis.RedisError:
        pass  # send anyway: the broker may still be there
    try:
        dispatch.apply_async(queue=Queue.CONTROL, expires=30, retry=False)
    except Exception:
        log.warning("could not request a dispatch; the beat tick will run one", exc_info=True)
        try:
            shared_client().delete(REQUESTED_KEY)  # the next request tries again
        except redis.RedisError:
            pass


def _wait_while_quiet() -> None:
    """Before a pass: while the quiet after this process's futile pass lasts, wait for it to end
    or for a request that must not wait (URGENT_KEY), whichever comes first. The holder waits
    with the leader lock (renewed after each pass: LEADER_TTL_MS is 20 waits), so the requests
    made meanwhile find it held, or REQUESTED_KEY set, and send nothing: this pass answers them
    all. Without Redis there is no wait."""
    left = _Quiet.until - time.monotonic()
    if left <= 0:
        return
    try:
        # Seconds with a fraction: Redis takes them since 6.0, and redis-py passes them on (its
        # annotation says int).
        client().blpop([URGENT_KEY], timeout=left)  # type: ignore[arg-type]
    except redis.RedisError:
        pass


@signals.worker_ready.connect
def _listen(sender=None, **kwargs) -> None:
    wake.start(sender, dispatch)  # a dispatcher's direct wake (wake.py); not in other workers


@signals.worker_shutting_down.connect
def _stop_listening(**kwargs) -> None:
    wake.stop()


# Passes one task runs while requests keep coming; then it hands on to a new message.
PASSES_PER_TASK = 20


@shared_task(name=Task.DISPATCH, ignore_result=True)
def dispatch() -> None:
    """One dispatcher pass at a time; requests arriving meanwhile make the holder go again.

    Each task marks DIRTY_KEY, then tries the lock. One that finds it held leaves its mark and
    REQUESTED_KEY set: the holder deletes both before its next pass reads the queue, so the
    requests made meanwhile send no message of their own (in a drain each pass had about three
    more messages, each a task's receipt, events and lock attempt on the dispatcher, for the one
    pass the holder ran anyway). The holder looks at the mark once more after letting go of the
    lock: one made before a failed try is then always seen by a holder, where a mark made
    between the holder's last look and its release waited for the beat tick. Before each pass the
    holder waits out a futile pass's quiet (`_wait_while_quiet`)."""
    lock = LeaderLock("dispatch", ttl_ms=LEADER_TTL_MS)
    try:
        client().set(DIRTY_KEY, 1, ex=60)
        if not lock.acquire():
            return
    except redis.RedisError:
        log.warning("redis unavailable: dispatching without the leader lock (the database guards)")
        _timed_pass()
        return
    passes = 0
    while True:
        try:
            while passes < PASSES_PER_TASK:
                _wait_while_quiet()
                # Before the pass reads the queue: later commits ask again.
                client().delete(DIRTY_KEY, REQUESTED_KEY, URGENT_KEY)
                _timed_pass()
                passes += 1
                if not client().get(DIRTY_KEY) or not lock.extend():
                    break
        finally:
            lock.release()
        if not client().get(DIRTY_KEY):
            return
        if passes >= PASSES_PER_TASK:
            dispatch.apply_async(queue=Queue.CONTROL, expires=30, retry=False)
            return
        if not lock.acquire():  # another holder took it after the mark: its pass answers it
            return


# How often the dispatcher measures the kept cluster's fragmentation for /metrics (after a pass,
# not inside it): the measure walks every node (5-8 ms of CPU at 1,000 nodes x 8 GPUs), where a
# scrape that read the cluster itself cost a full read (0.7-1.0 s of the web's CPU there).
FRAGMENTATION_EVERY_S = 15.0
_measured = {"at": float("-inf")}


def _timed_pass() -> None:
    started = time.monotonic()
    result = dispatcher.dispatch_once()
    seconds = time.monotonic() - started
    _quiet_after(result)
    fragmentation = None
    if started - _measured["at"] >= FRAGMENTATION_EVERY_S:
        fragmentation = kept.KEPT.fragmentation()
        if fragmentation is not None:
            _measured["at"] = started
    record_dispatch_pass(seconds, fragmentation=fragmentation)  # for /metrics


def _quiet_after(result: dispatcher.DispatchResult) -> None:
    """Start QUIET_MS of waiting before this process's next pass after a futile one; end it after
    any other."""
    _Quiet.until = time.monotonic() + QUIET_MS / 1000 if result.futile else float("-inf")


@shared_task(name=Task.RECONCILE, ignore_result=True)
def reconcile_tick() -> None:
    reconcile.reconcile_once()
