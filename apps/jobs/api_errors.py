"""One shape for every error: `{"<field>": ["message"]}` with the right status, never a 500
for input. A malformed body is reported under the field `body`."""

from rest_framework import status
from rest_framework.exceptions import ParseError
from rest_framework.response import Response
from rest_framework.views import exception_handler as drf_exception_handler

from apps.platform.errors import ServiceError
from apps.scheduling.figures import record_admission_rejection


def exception_handler(exc, context):
    if isinstance(exc, ParseError):
        return Response(
            {"body": [f"malformed request body: {exc.detail}"]}, status=status.HTTP_400_BAD_REQUEST
        )
    if isinstance(exc, ServiceError):
        _count_refused_submit(exc, context)
        response = Response({exc.field or "detail": [exc.message]}, status=exc.status)
        if exc.retry_after is not None:
            response["Retry-After"] = str(exc.retry_after)
        return response
    if isinstance(exc, RecursionError):
        return Response(
            {"body": ["request body is nested too deeply"]}, status=status.HTTP_400_BAD_REQUEST
        )
    return drf_exception_handler(exc, context)


def _count_refused_submit(exc: ServiceError, context) -> None:
    """A refused submission counts in /metrics (`gpuplatform_admission_rejections{reason}`)."""
    view = context.get("view")
    if getattr(view, "action", None) != "create" or exc.status not in (403, 409, 429, 503):
        return
    name = type(exc).__name__
    record_admission_rejection(
        "".join(f"_{c.lower()}" if c.isupper() else c for c in name).lstrip("_")
    )
