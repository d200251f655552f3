"""The dispatcher's leader lock with a fencing token. The shared Redis client lives on the ground
floor (apps/platform/redis.py), where every layer may use it; it is importable here too."""

import os
import socket
import uuid
from typing import cast

from apps.platform.redis import client, shared_client  # noqa: F401 (importable from here too)

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
        self.fence = int(
            cast(int, client().incr(f"{self.key}:fence"))
        )  # a sync client: never an Awaitable
        return True

    def extend(self) -> bool:
        """Renew the lease if we still hold it; False if it lapsed (someone else may hold it)."""
        return bool(
            client().eval(_EXTEND, 1, self.key, self.token, str(self.ttl_ms))
        )  # the same bytes on the wire

    def release(self) -> None:
        client().eval(_RELEASE, 1, self.key, self.token)
