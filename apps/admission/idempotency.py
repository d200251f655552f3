"""`Idempotency-Key`: the same key with the same body within 24 hours returns the job the first
request created (200); the same key with another body is a conflict (409). Keys belong to a
tenant: another tenant's identical key is a different key."""

from __future__ import annotations

import hashlib
import json
from datetime import timedelta

from django.utils import timezone

from apps.admission.models import IdempotencyKey
from apps.jobs.models import Job
from apps.platform.errors import IdempotencyConflict, ServiceError
from apps.tenants.models import Tenant

TTL = timedelta(hours=24)
MAX_KEY_LENGTH = 255


def body_digest(body) -> str:
    """SHA-256 of the body's canonical JSON: key order and spacing do not make it "other"."""
    canonical = json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(canonical.encode()).hexdigest()


def clean_key(key: str | None) -> str | None:
    if key is None:
        return None
    key = key.strip()
    if not key or len(key) > MAX_KEY_LENGTH:
        raise ServiceError(
            f"Idempotency-Key must be 1 to {MAX_KEY_LENGTH} characters", field="Idempotency-Key"
        )
    return key


def replay(*, tenant: Tenant, key: str | None, digest: str) -> Job | None:
    """The job an earlier request with this key created, if the key is live; 409 if the body
    differs. An expired key is forgotten so it can be used again."""
    if key is None:
        return None
    row = IdempotencyKey.objects.filter(tenant=tenant, key=key).select_related("job").first()
    if row is None:
        return None
    if row.created_at < timezone.now() - TTL:
        IdempotencyKey.objects.filter(pk=row.pk).delete()
        return None
    if row.body_sha256 != digest:
        raise IdempotencyConflict(
            "this Idempotency-Key was used with a different request body", field="Idempotency-Key"
        )
    return row.job


def remember(*, tenant: Tenant, key: str | None, digest: str, job: Job) -> None:
    """Record the key; raises IntegrityError if a concurrent request recorded it first."""
    if key is not None:
        IdempotencyKey.objects.create(tenant=tenant, key=key, body_sha256=digest, job=job)
