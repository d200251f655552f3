"""The shared Redis client: what must be fast and shared (token buckets aside, which keep their
own short timeouts in apps/admission/buckets.py). Losing Redis loses no job."""

import functools
import os

import redis
from django.conf import settings


@functools.cache
def client() -> redis.Redis:
    return redis.Redis.from_url(settings.REDIS_URL, socket_timeout=2, socket_connect_timeout=2)


_shared: dict[int, redis.Redis] = {}  # pid -> client: a forked child makes its own


def shared_client() -> redis.Redis:
    """This process's one client (a connection pool; thread-safe), for calls on hot paths that
    a new connection each would cost more than the call."""
    pid = os.getpid()
    conn = _shared.get(pid)
    if conn is None:
        conn = _shared[pid] = client()
    return conn
