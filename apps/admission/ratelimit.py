"""Submit rate limits: a token bucket per tenant (rate and burst from its tier, overridden by
its quota) and one per user (USER_SUBMIT_SHARE of the tenant's), shared in Redis and spent from
this process's lease of both (leases.py).

When Redis does not answer, the tier decides: tiers in RATE_LIMIT_FAIL_OPEN_TIERS are admitted
(logged and counted), the others get 503 with Retry-After. The queued-job cap and the GPU-hour
quota live in the database and keep holding either way.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass, field

import redis
from django.conf import settings

from apps.admission import buckets, leases
from apps.admission.counters import bump
from apps.platform.errors import AdmissionUnavailable, RateLimited
from apps.tenants.models import Tenant

log = logging.getLogger(__name__)
REDIS_DOWN_RETRY_AFTER = 5  # seconds; Redis restarts are usually that quick


@dataclass(frozen=True)
class RateDecision:
    admitted: bool
    headers: dict[str, str] = field(default_factory=dict)
    retry_after: int | None = None
    message: str = ""

    def raise_if_refused(self) -> None:
        if not self.admitted:
            raise RateLimited(self.message, field="rate_limit", retry_after=self.retry_after)


def submit_buckets(tenant: Tenant, user, limits: dict) -> list[buckets.Bucket]:
    rate, burst = limits["submit_rate_per_minute"], limits["submit_burst"]
    share = settings.USER_SUBMIT_SHARE
    return [
        buckets.Bucket(f"{buckets.PREFIX}tenant:{tenant.pk}", rate, burst),
        buckets.Bucket(
            f"{buckets.PREFIX}user:{user.pk}", rate * share, max(1, math.floor(burst * share))
        ),
    ]


def headers_for(result: buckets.TakeResult) -> dict[str, str]:
    """X-RateLimit-*: the binding bucket's size, whole tokens left, seconds until it is full."""
    tight = result.tightest
    return {
        "X-RateLimit-Limit": str(tight.bucket.burst),
        "X-RateLimit-Remaining": str(tight.remaining),
        "X-RateLimit-Reset": str(math.ceil(tight.seconds_to_full)),
    }


def check_submit(*, tenant: Tenant, user, limits: dict) -> RateDecision:
    """Take a submit token for this tenant and user, or say when to come back."""
    try:
        result = leases.LEASES.take(submit_buckets(tenant, user, limits))
    except redis.RedisError as error:
        return _redis_down(tenant, error)
    headers = headers_for(result)
    if result.taken:
        return RateDecision(admitted=True, headers=headers)
    retry = result.retry_after
    headers["Retry-After"] = str(retry)
    who = "tenant" if result.tightest.bucket.key.startswith(f"{buckets.PREFIX}tenant:") else "user"
    return RateDecision(
        admitted=False, headers=headers, retry_after=retry,
        message=f"{who} submit rate limit reached ({result.tightest.bucket.burst} burst, "
        f"{result.tightest.bucket.rate_per_minute:g}/min); retry in {retry}s",
    )  # fmt: skip


def _redis_down(tenant: Tenant, error: Exception) -> RateDecision:
    tier = tenant.tier.name
    if tier in settings.RATE_LIMIT_FAIL_OPEN_TIERS:
        log.warning(
            "rate limiter: redis unavailable (%s); tier %s fails open, admitting %s",
            error,
            tier,
            tenant.slug,
        )
        bump(f"rate_limit_redis_down_admitted:{tier}")
        return RateDecision(
            admitted=True, headers={"X-RateLimit-Degraded": "redis unavailable; admitted"}
        )
    log.warning(
        "rate limiter: redis unavailable (%s); tier %s fails closed, refusing %s",
        error,
        tier,
        tenant.slug,
    )
    bump(f"rate_limit_redis_down_refused:{tier}")
    raise AdmissionUnavailable(
        "submissions are paused: the rate limiter is unavailable", field="rate_limit",
        retry_after=REDIS_DOWN_RETRY_AFTER,
    )  # fmt: skip
