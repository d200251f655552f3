"""Each web process's own token buckets: leases of the shared Redis buckets (buckets.py), spent
locally, so that a submit makes no Redis round trip while its process holds tokens for it.

A lease is taken for a (tenant, user) pair: up to one second of refill (`lease_size`), as many
as both buckets hold, taken from both at once in Redis. The process spends them one a submit;
once empty it takes another. A lease lives RATE_LIMIT_LEASE_SECONDS (1 s) at most: then a thread
of the process (or the next submit, with its take) gives the unspent tokens back, so the shared
buckets are reconciled at least once a second. When Redis has no token, its answer says when
one comes, and the process refuses on its own until then.

Every admitted submit spends a token taken from the shared buckets, so no process admits beyond
them: over-admission is none while Redis answers (docs/admission.md, "Rate limits", with its
cost: tokens leased by one process and not spent wait there, one lease period at most)."""

from __future__ import annotations

import math
import os
import threading
import time
from dataclasses import dataclass, field

import redis
from django.conf import settings

from apps.admission import buckets


def lease_seconds() -> float:
    """The longest a process keeps tokens (or a refusal) without asking Redis (0: it asks for
    every submit)."""
    return settings.RATE_LIMIT_LEASE_SECONDS


def lease_size(bucket: buckets.Bucket) -> int:
    """What one lease takes at most: one lease period's refill, within the burst (a slow bucket,
    60/min or less, is leased one token at a time, as tokens were taken before leases)."""
    refill = math.floor(bucket.rate_per_second * lease_seconds())
    return max(1, min(bucket.burst, refill))


@dataclass
class Lease:
    wanted: list[buckets.Bucket]
    tokens: int  # unspent
    shared: buckets.TakeResult  # Redis's answer when it was taken: the shared buckets after it
    taken_at: float = field(default_factory=time.monotonic)

    def fresh(self, now: float) -> bool:
        return now - self.taken_at < lease_seconds()

    def result(self, taken: int, now: float) -> buckets.TakeResult:
        """The shared buckets as this process sees them: Redis's last answer, its waits less the
        time since, plus what this lease still holds (taken and not spent)."""
        since = now - self.taken_at
        states = []
        for state in self.shared.states:
            tokens = state.tokens + self.tokens
            states.append(buckets.BucketState(
                bucket=state.bucket, tokens=tokens,
                seconds_to_token=0.0 if tokens >= 1 else max(0.0, state.seconds_to_token - since),
                seconds_to_full=max(0.0, state.seconds_to_full - since
                                    - self.tokens / state.bucket.rate_per_second),
            ))  # fmt: skip
        return buckets.TakeResult(taken=taken, states=states)

    def refused_for(self, now: float) -> float:
        """Seconds until the shared buckets should hold a token again (0: ask Redis)."""
        wait = max(s.seconds_to_token for s in self.shared.states)
        return max(0.0, wait - (now - self.taken_at))


class Leases:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.held: dict[tuple[str, ...], Lease] = {}
        self.takers: dict[tuple[str, ...], threading.Lock] = {}
        self.reconciler: threading.Thread | None = None
        self.reconciler_pid = 0

    def take(self, wanted: list[buckets.Bucket]) -> buckets.TakeResult:
        """One token from every bucket, or none if any is empty. Raises RedisError where Redis
        must be asked and does not answer.

        One lease at a time a (tenant, user) pair in a process: the threads that find the lease
        spent while another takes the next wait for it and spend from it. When each took its
        own, a burst of submits to a process with a spent lease took one lease a thread, up to
        the threads' count times the lease size, which emptied a bucket smaller than that, and
        the threads whose lease came back empty answered 429 while their process held tokens."""
        self.reconcile_in_background()
        key = tuple(b.key for b in wanted)
        spent = self.spend(key, wanted)
        if spent is not None:
            return spent
        with self.leasing(key):
            spent = self.spend(key, wanted)  # another thread's lease, taken while this one waited
            if spent is not None:
                return spent
            with self.lock:
                held = self.held.pop(key, None)
            back = held.tokens if held is not None else 0
            answer = buckets.lease(wanted, min(lease_size(b) for b in wanted), back=back)
            lease = Lease(wanted=wanted, tokens=answer.taken, shared=answer)
            taken = min(1, lease.tokens)
            lease.tokens -= taken
            with self.lock:
                self.held[key] = lease
            return lease.result(taken=taken, now=lease.taken_at)

    def spend(
        self, key: tuple[str, ...], wanted: list[buckets.Bucket]
    ) -> buckets.TakeResult | None:
        """A token from this process's fresh lease, or its remembered refusal; None when Redis
        must be asked."""
        now = time.monotonic()
        with self.lock:
            held = self.held.get(key)
            if held is None or not held.fresh(now) or held.wanted != wanted:
                return None
            if held.tokens >= 1:
                held.tokens -= 1
                return held.result(taken=1, now=now)
            if held.refused_for(now) > 0:
                return held.result(taken=0, now=now)  # refused until its Retry-After
            return None

    def leasing(self, key: tuple[str, ...]) -> threading.Lock:
        """The lock held while a lease of this pair is taken (one a pair, kept while the process
        lives: a few bytes a tenant-user pair that submitted)."""
        with self.lock:
            return self.takers.setdefault(key, threading.Lock())

    def unspent(self, wanted: list[buckets.Bucket]) -> int:
        held = self.held.get(tuple(b.key for b in wanted))
        return held.tokens if held is not None and held.fresh(time.monotonic()) else 0

    def give_back_stale(self) -> None:
        """Return the unspent tokens of every lease past its period (lost if Redis does not
        answer: the shared bucket refills them)."""
        now = time.monotonic()
        with self.lock:
            stale = [k for k, lease in self.held.items() if not lease.fresh(now)]
            ended = [self.held.pop(k) for k in stale]
        for lease in ended:
            if lease.tokens:
                try:
                    buckets.give_back(lease.wanted, lease.tokens)
                except redis.RedisError:
                    pass

    def forget(self) -> None:
        with self.lock:
            self.held.clear()

    def reconcile_in_background(self) -> None:
        """This process's reconciler thread (again after a fork: threads do not cross one)."""
        if self.reconciler_pid == os.getpid() or not lease_seconds():
            return
        with self.lock:
            if self.reconciler_pid != os.getpid():
                self.held.clear()
                self.takers.clear()  # a lock held by a parent's thread stays held in a child
                self.reconciler_pid = os.getpid()
                self.reconciler = threading.Thread(
                    target=self.reconcile_forever, name="rate-limit-leases", daemon=True
                )
                self.reconciler.start()

    def reconcile_forever(self) -> None:
        while threading.main_thread().is_alive():
            time.sleep(max(0.05, lease_seconds() / 2))
            self.give_back_stale()


LEASES = Leases()
