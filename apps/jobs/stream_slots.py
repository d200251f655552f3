"""Open event streams, counted per token and per tenant in Redis with a lease.

Each open stream holds one member in two sorted sets (its token's and its tenant's), scored by
the time its lease ends on the Redis server's clock. The process serving the stream renews the
lease while it is open and removes the member when it closes; a process that dies without
closing leaves members that stop counting when their lease ends, so no slot leaks for longer
than `LEASE_SECONDS`. Every web process counts in the same sets, so the caps hold across them.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import cast

from django.conf import settings

from apps.platform.redis import shared_client

PREFIX = "gpuplatform:streams:"
LEASE_SECONDS = 30  # renewed every RENEW_SECONDS by the process serving the stream
RENEW_SECONDS = 10
RETRY_AFTER_SECONDS = 5

# KEYS: the token's set, the tenant's set. ARGV: member, lease seconds, token cap, tenant cap.
# Returns 0 (taken), 1 (the token is at its cap) or 2 (the tenant is).
_ACQUIRE = """
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1e6
local lease = tonumber(ARGV[2])
for _, key in ipairs(KEYS) do redis.call('ZREMRANGEBYSCORE', key, '-inf', now) end
if redis.call('ZCARD', KEYS[1]) >= tonumber(ARGV[3]) then return 1 end
if redis.call('ZCARD', KEYS[2]) >= tonumber(ARGV[4]) then return 2 end
for _, key in ipairs(KEYS) do
  redis.call('ZADD', key, now + lease, ARGV[1])
  redis.call('EXPIRE', key, math.ceil(lease) + 1)
end
return 0
"""
# Only members still present: a lapsed one was counted out and must not come back.
_RENEW = """
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1e6
local lease = tonumber(ARGV[2])
for _, key in ipairs(KEYS) do
  redis.call('ZADD', key, 'XX', now + lease, ARGV[1])
  redis.call('EXPIRE', key, math.ceil(lease) + 1)
end
return 0
"""


@dataclass(frozen=True)
class Slot:
    keys: tuple[str, str]
    member: str


class OverCap(Exception):
    def __init__(self, scope: str):
        super().__init__(scope)
        self.scope = scope  # "token" or "tenant"


def token_key(holder: str) -> str:
    return f"{PREFIX}token:{holder}"


def tenant_key(tenant_id) -> str:
    return f"{PREFIX}tenant:{tenant_id}"


def take(keys: Sequence[str], member: str, *, lease: float, caps: tuple[int, int]) -> int:
    """Lease `member` a place in both sets of `keys` (the holder's, then the tenant's), each
    capped: 0 taken, 1 the first set is full, 2 the second is. Event streams here, and
    interactive sessions (apps/scheduling/sessions.py), count their open connections with it."""
    args = (*keys, member, str(lease), *map(str, caps))
    return int(cast(str, shared_client().eval(_ACQUIRE, len(keys), *args)))


def renew_in(pipe, keys: Sequence[str], member: str, *, lease: float) -> None:
    """Queue the renewal of a lease `take` gave (not of one that lapsed) on a pipeline."""
    pipe.eval(_RENEW, len(keys), *keys, member, str(lease))


def acquire(*, holder: str, tenant_id) -> Slot:
    """A slot for one stream, or OverCap. `holder`: who opens it (a token id, or the user for a
    web session), never a secret."""
    slot = Slot((token_key(holder), tenant_key(tenant_id)), uuid.uuid4().hex)
    caps = (settings.MAX_STREAMS_PER_TOKEN, settings.MAX_STREAMS_PER_TENANT)
    answer = take(slot.keys, slot.member, lease=LEASE_SECONDS, caps=caps)
    if answer:
        raise OverCap("token" if answer == 1 else "tenant")
    return slot


def renew(slots: list[Slot]) -> None:
    pipe = shared_client().pipeline(transaction=False)
    for slot in slots:
        renew_in(pipe, slot.keys, slot.member, lease=LEASE_SECONDS)
    pipe.execute()


def release(slots: list[Slot]) -> None:
    pipe = shared_client().pipeline(transaction=False)
    for slot in slots:
        for key in slot.keys:
            pipe.zrem(key, slot.member)
    pipe.execute()


def open_count(key: str) -> int:
    """Members whose lease has not ended (for tests and operators)."""
    conn = shared_client()
    seconds, micros = cast(tuple[int, int], conn.time())
    return int(cast(int, conn.zcount(key, f"({seconds + micros / 1e6}", "+inf")))
