"""Per-receiver concurrency: at most `WEBHOOK_RECEIVER_CONCURRENCY` sends to one receiver
(scheme://host:port) at a time, across every worker process, so a slow receiver ties up at
most that many delivery threads and the others keep serving everyone else.

A counting semaphore in Redis: a sorted set of holders scored by when their lease ends. A
holder that dies (worker killed mid-send) stops counting when its lease ends, so a slot is never
lost for good. The lease outlasts any one send (the sender's deadline), and `receiver_slot` is
held for one send at a time.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import time
import uuid
from collections.abc import Iterator

import redis
from django.conf import settings

from apps.platform.redis import shared_client

log = logging.getLogger(__name__)

PREFIX = "gpuplatform:webhook-slot:"
LEASE_SECONDS = 60

_ACQUIRE = """
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', ARGV[1])
if redis.call('ZCARD', KEYS[1]) < tonumber(ARGV[3]) then
  redis.call('ZADD', KEYS[1], ARGV[2], ARGV[4])
  redis.call('EXPIRE', KEYS[1], ARGV[5])
  return 1
end
return 0
"""


def key_for(origin: str) -> str:
    return PREFIX + hashlib.sha256(origin.encode()).hexdigest()[:32]


def acquire(origin: str, *, limit: int | None = None) -> str | None:
    """A holder token, or None when the receiver already has `limit` sends in flight."""
    limit = limit or settings.WEBHOOK_RECEIVER_CONCURRENCY
    token, now = uuid.uuid4().hex, time.time()
    args = (str(now), str(now + LEASE_SECONDS), str(limit), token, str(LEASE_SECONDS * 2))
    got = shared_client().eval(_ACQUIRE, 1, key_for(origin), *args)
    return token if got else None


def release(origin: str, token: str) -> None:
    with contextlib.suppress(redis.RedisError):
        shared_client().zrem(key_for(origin), token)


@contextlib.contextmanager
def receiver_slot(origin: str) -> Iterator[bool]:
    """Yields whether a slot was had; the caller skips the send (it stays due) when not."""
    try:
        token = acquire(origin)
    except redis.RedisError:
        log.warning("webhook slots: Redis unavailable; deliveries to %s wait", origin)
        token = None  # without the count, no send: deliveries stay due and go when Redis is back
    try:
        yield token is not None
    finally:
        if token is not None:
            release(origin, token)
