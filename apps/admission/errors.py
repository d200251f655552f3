"""Refusals of admission. They are ServiceErrors, so the API's exception handler shapes them
(`{"<field>": ["message"]}`, the status, `Retry-After`) like every other refusal."""

from apps.jobs.services import NotAllowed, ServiceError


class RateLimited(ServiceError):
    status = 429


class AdmissionUnavailable(ServiceError):
    """Redis is down and the tenant's tier fails closed."""

    status = 503


class IdempotencyConflict(ServiceError):
    status = 409


class GpuHoursExhausted(NotAllowed):
    status = 403
