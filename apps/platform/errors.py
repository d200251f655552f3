"""Refusals every service may raise. The API's exception handler shapes them all alike
(`{"<field>": ["message"]}`, the status, `Retry-After`). No Django here: the node agent
imports these too."""


class ServiceError(Exception):
    """A request the platform understood and refused; `status` is the HTTP answer."""

    status = 400

    def __init__(self, message: str, *, field: str | None = None, retry_after: int | None = None):
        super().__init__(message)
        self.message = message
        self.field = field
        self.retry_after = retry_after


class NotAllowed(ServiceError):
    status = 403


class QueueFull(ServiceError):
    status = 429


class RateLimited(ServiceError):
    status = 429


class AdmissionUnavailable(ServiceError):
    """Redis is down and the tenant's tier fails closed."""

    status = 503


class IdempotencyConflict(ServiceError):
    status = 409


class GpuHoursExhausted(NotAllowed):
    status = 403


class UnknownObject(ServiceError):
    """An id the request names that the caller cannot see (another tenant's, or none): 404."""

    status = 404


class NotRunning(ServiceError):
    """A session (shell, exec, port-forward) on a job that is not running (yet, or any more)."""

    status = 409
