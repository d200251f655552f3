"""Token buckets in Redis: one Lua script takes tokens from several buckets at once (the
tenant's and the user's), the same number from each, on Redis's own clock, so every web process
shares the same buckets and two requests can never spend one token. A web process takes them a
lease at a time and spends them locally (apps/admission/leases.py).

A bucket is a hash {t: tokens, ts: last refill time}; it refills `rate` tokens per second up to
`burst` and expires once it would be full again (a full bucket and a missing one are the same).
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import redis
from django.conf import settings

PREFIX = "gpuplatform:rl:"

# KEYS: the buckets. ARGV: rate per second and burst of each bucket, then tokens to give back
# (a lease's unspent ones, apps/admission/leases.py), then how many to take: as many as every
# bucket holds up to that number (0: only look). Returns [taken, then per bucket: tokens left,
# seconds to one token, seconds to full].
_TAKE = """
if redis.replicate_commands then pcall(redis.replicate_commands) end
local now_t = redis.call('TIME')
local now = tonumber(now_t[1]) + tonumber(now_t[2]) / 1000000
local back = tonumber(ARGV[#ARGV - 1])
local want = tonumber(ARGV[#ARGV])
local tokens = {}
local n = want
for i = 1, #KEYS do
  local rate, burst = tonumber(ARGV[2 * i - 1]), tonumber(ARGV[2 * i])
  local state = redis.call('HMGET', KEYS[i], 't', 'ts')
  local t, ts = tonumber(state[1]), tonumber(state[2])
  if t == nil or ts == nil then t, ts = burst, now end
  t = math.min(burst, t + math.max(0, now - ts) * rate + back)
  tokens[i] = t
  n = math.min(n, math.floor(t))
end
n = math.max(0, n)
local out = {n}
for i = 1, #KEYS do
  local rate, burst = tonumber(ARGV[2 * i - 1]), tonumber(ARGV[2 * i])
  local t = tokens[i] - n
  if want > 0 or back > 0 then
    redis.call('HSET', KEYS[i], 't', tostring(t), 'ts', tostring(now))
    redis.call('EXPIRE', KEYS[i], math.ceil((burst - t) / rate) + 1)
  end
  local wait = 0
  if t < 1 then wait = (1 - t) / rate end
  table.insert(out, tostring(t))
  table.insert(out, tostring(wait))
  table.insert(out, tostring((burst - t) / rate))
end
return out
"""


@dataclass(frozen=True)
class Bucket:
    key: str
    rate_per_minute: float
    burst: int

    @property
    def rate_per_second(self) -> float:
        return self.rate_per_minute / 60.0


@dataclass(frozen=True)
class BucketState:
    bucket: Bucket
    tokens: float
    seconds_to_token: float
    seconds_to_full: float

    @property
    def remaining(self) -> int:
        return max(0, math.floor(self.tokens))


@dataclass(frozen=True)
class TakeResult:
    taken: int  # tokens taken from every bucket (0: none)
    states: list[BucketState]

    @property
    def tightest(self) -> BucketState:
        """The bucket that binds: fewest whole tokens left, then the longest wait."""
        return min(self.states, key=lambda s: (s.remaining, -s.seconds_to_token))

    @property
    def retry_after(self) -> int:
        """Whole seconds until every bucket holds a token: waiting that long is enough."""
        return max(1, math.ceil(max(s.seconds_to_token for s in self.states) - 1e-9))


@functools.cache
def client() -> redis.Redis:
    # Short timeouts: a Redis outage must turn into the documented fail mode quickly, not hang
    # a web worker.
    return redis.Redis.from_url(settings.REDIS_URL, socket_timeout=0.5, socket_connect_timeout=0.5)


@functools.cache
def _script(conn: redis.Redis):
    return conn.register_script(_TAKE)


def _run(
    buckets: list[Bucket], *, want: int, back: int = 0, conn: redis.Redis | None = None
) -> TakeResult:
    conn = conn or client()
    args: list = []
    for bucket in buckets:
        args += [repr(bucket.rate_per_second), bucket.burst]
    raw = _script(conn)(keys=[b.key for b in buckets], args=[*args, back, want])
    values = [float(v) for v in raw[1:]]
    states = [
        BucketState(
            bucket=b,
            tokens=values[3 * i],
            seconds_to_token=values[3 * i + 1],
            seconds_to_full=values[3 * i + 2],
        )
        for i, b in enumerate(buckets)
    ]
    return TakeResult(taken=int(raw[0]), states=states)


def take(buckets: list[Bucket], *, conn: redis.Redis | None = None) -> TakeResult:
    """Take one token from every bucket, or from none if any is empty. Raises RedisError."""
    return _run(buckets, want=1, conn=conn)


def lease(buckets: list[Bucket], want: int, *, back: int = 0) -> TakeResult:
    """Give back `back` tokens to every bucket (a lease's unspent ones), then take as many as
    every bucket holds, `want` at most. Raises RedisError."""
    return _run(buckets, want=want, back=back)


def give_back(buckets: list[Bucket], tokens: int) -> None:
    """Return a lease's unspent tokens (a full bucket keeps no more than its burst)."""
    _run(buckets, want=0, back=tokens)


def peek(buckets: list[Bucket], *, conn: redis.Redis | None = None) -> TakeResult:
    """The buckets' state now, taking nothing."""
    return _run(buckets, want=0, conn=conn)
