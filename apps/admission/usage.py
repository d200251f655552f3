"""What `/api/v1/usage/` adds for admission: the rate-limit buckets as they stand (nothing is
taken by looking), GPU-hours this period, and GPUs in use against the per-SKU caps."""

from __future__ import annotations

import math

import redis

from apps.admission import buckets
from apps.admission.leases import LEASES
from apps.admission.quotas import gpu_hours, gpus_in_use
from apps.admission.ratelimit import submit_buckets
from apps.tenants.models import Tenant


def admission_usage(*, tenant: Tenant, user, limits: dict) -> dict:
    return {
        "rate_limits": bucket_state(tenant, user, limits),
        "gpu_hours": gpu_hours(tenant, limits).as_dict(),
        "gpu_caps": gpu_caps(tenant, limits),
    }


def bucket_state(tenant: Tenant, user, limits: dict) -> dict:
    wanted = submit_buckets(tenant, user, limits)
    try:
        states = buckets.peek(wanted).states
    except redis.RedisError:
        return {"available": False}
    held = LEASES.unspent(wanted)  # taken by this process and not spent: still the tenant's
    out: dict[str, object] = {"available": True}
    for name, state in zip(("tenant", "user"), states, strict=True):
        rate = state.bucket.rate_per_second
        out[name] = {
            "rate_per_minute": round(state.bucket.rate_per_minute, 3), "burst": state.bucket.burst,
            "remaining": max(0, math.floor(state.tokens + held)),
            "seconds_to_full": round(max(0.0, state.seconds_to_full - held / rate), 1),
        }  # fmt: skip
    return out


def gpu_caps(tenant: Tenant, limits: dict) -> dict:
    in_use = gpus_in_use([tenant.pk]).get(tenant.pk, {})
    return {
        sku: {"cap": cap, "in_use": in_use.get(sku, 0)}
        for sku, cap in sorted(limits["max_gpus"].items())
    }
