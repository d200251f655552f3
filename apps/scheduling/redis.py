"""The shared Redis client, and the dispatcher's leader lock with a fencing token."""

import functools
import os
import socket
import uuid
from typing import cast

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


# Release only if we still hold it: the value is our token.
_RELEASE = """
if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('del', KEYS[1]) else return 0 end
"""
_EXTEND = """
if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('pexpire', KEYS[1], ARGV[2]) else return 0 end
"""


class LeaderLock:
    """A lease in Redis (`SET NX PX`). `fence` grows with every acquisition so a paused old
    leader's writes can be told apart; the job row's guarded update is the final guard anyway."""

    def __init__(self, name: str, ttl_ms: int = 30_000):
        self.key, self.ttl_ms = f"gpuplatform:lock:{name}", ttl_ms
        # Unique per holder, and says who holds it (host:pid:random) for operators and tests.
        self.token = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex}"
        self.fence: int | None = None

    def acquire(self) -> bool:
        if not client().set(self.key, self.token, nx=True, px=self.ttl_ms):
            return False
        self.fence = int(cast(int, client().incr(f"{self.key}:fence")))  # a sync client: never an Awaitable
        return True

    def extend(self) -> bool:
        """Renew the lease if we still hold it; False if it lapsed (someone else may hold it)."""
        return bool(client().eval(_EXTEND, 1, self.key, self.token, str(self.ttl_ms)))  # the same bytes on the wire

    def release(self) -> None:
        client().eval(_RELEASE, 1, self.key, self.token)
