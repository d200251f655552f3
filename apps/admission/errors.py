"""Refusals of admission. They live on the ground floor (apps/platform/errors.py) with every
other ServiceError; this module keeps the names admission's callers import."""

from apps.platform.errors import (  # noqa: F401 (re-exported)
    AdmissionUnavailable,
    GpuHoursExhausted,
    IdempotencyConflict,
    NotAllowed,
    RateLimited,
    ServiceError,
)

__all__ = [
    "AdmissionUnavailable",
    "GpuHoursExhausted",
    "IdempotencyConflict",
    "NotAllowed",
    "RateLimited",
    "ServiceError",
]
