"""`GET /api/v1/jobs/{id}/events/`: a job's life as Server-Sent Events, for programs.

Events: `state` (one per audit-log transition, in order), `progress` (when it changes), `log`
(one per output line of the current attempt) and `end` (the job is terminal; the stream
closes). Each message's `id` is a cursor (`<audit event id>.<attempt>.<log offset>`), so a
client that reconnects with `Last-Event-ID` resumes where it left off without repeats.

The view checks who asks (token or session; another tenant's job is 404) and takes a slot under
the per-token and per-tenant caps (429 with `Retry-After` over them), then answers with an async
stream: under the ASGI server (gpuplatform/asgi.py) it waits on the event loop and holds no web
thread, while the process's one poller (apps/jobs/event_hub.py) reads the database for every
stream. A stream still lives a bounded time (`?timeout=`, default 30 s, at most 120 s) so that a
client's slot comes back even if it never closes; EventSource clients reconnect on their own.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
from collections.abc import AsyncIterator

from django.db import connection
from django.http import StreamingHttpResponse
from django.shortcuts import get_object_or_404
from drf_spectacular.utils import OpenApiParameter, extend_schema
from redis.exceptions import RedisError
from rest_framework.exceptions import Throttled
from rest_framework.renderers import BaseRenderer, JSONRenderer
from rest_framework.views import APIView

from apps.jobs import stream_slots
from apps.jobs.access import membership_of, visible_jobs
from apps.jobs.event_hub import END, HUB, Cursor, Subscriber
from apps.jobs.lookup import resolve

logger = logging.getLogger(__name__)

KEEPALIVE_SECONDS = 10
DEFAULT_LIFETIME_SECONDS = 30
MAX_LIFETIME_SECONDS = 120
RETRY_MILLISECONDS = 1000


class EventStreamRenderer(BaseRenderer):
    """Lets DRF accept `Accept: text/event-stream`; used only for errors (401, 404, 429)."""

    media_type = "text/event-stream"
    format = "sse"

    def render(self, data, accepted_media_type=None, renderer_context=None) -> bytes:
        return f"event: error\ndata: {json.dumps(data, default=str)}\n\n".encode()


def lifetime_from(raw: str | None) -> float:
    try:
        seconds = float(raw) if raw else DEFAULT_LIFETIME_SECONDS
    except ValueError:
        seconds = DEFAULT_LIFETIME_SECONDS
    if seconds != seconds:  # NaN
        seconds = DEFAULT_LIFETIME_SECONDS
    return min(MAX_LIFETIME_SECONDS, max(1.0, seconds))


def stream_holder(request) -> str:
    """Whom the per-token cap counts: the token (by a digest of its id, never the secret), or
    the user for a web session."""
    token_id = getattr(request.auth, "pk", None)
    if token_id is None:
        return f"user-{request.user.pk}"
    return "t-" + hashlib.sha256(str(token_id).encode()).hexdigest()[:24]


def take_slot(*, holder: str, tenant_id) -> stream_slots.Slot | None:
    """A slot under the caps, or 429. Without Redis the caps cannot be counted: the stream is
    served uncounted (it holds no thread, and still ends at its lifetime) rather than refused."""
    try:
        return stream_slots.acquire(holder=holder, tenant_id=tenant_id)
    except stream_slots.OverCap as over:
        raise Throttled(
            wait=stream_slots.RETRY_AFTER_SECONDS,
            detail=f"too many open event streams for this {over.scope}; close one or retry later",
        ) from None
    except RedisError:
        logger.warning("event streams: Redis unavailable, a stream opened without counting it")
        return None


class JobEventsView(APIView):
    renderer_classes = [JSONRenderer, EventStreamRenderer]

    @extend_schema(
        parameters=[
            OpenApiParameter(
                "timeout", float, description="seconds before the server closes (1-120)"
            )
        ],
        responses={(200, "text/event-stream"): str},
    )
    def get(self, request, pk):
        jobs = visible_jobs(request.user)  # `pk`: the id or a unique prefix (apps/jobs/lookup.py)
        job = get_object_or_404(jobs, pk=resolve(jobs, pk, what="job"))
        cursor = Cursor.parse(
            request.headers.get("Last-Event-ID") or request.query_params.get("last_event_id")
        )
        lifetime = lifetime_from(request.query_params.get("timeout"))
        membership = membership_of(request.user)
        tenant_id = membership.tenant_id if membership is not None else job.tenant_id
        slot = take_slot(holder=stream_holder(request), tenant_id=tenant_id)
        if not connection.in_atomic_block:
            # The stream may stay open two minutes: its request must not keep a database
            # connection (200 streams would be 200 PostgreSQL connections). The poller reads.
            connection.close()
        response = StreamingHttpResponse(
            job_stream(job.pk, cursor, lifetime=lifetime, slot=slot),
            content_type="text/event-stream",
        )
        response["Cache-Control"] = "no-cache"
        response["X-Accel-Buffering"] = "no"  # a proxy in front must not hold the stream back
        return response


async def job_stream(job_id, cursor: Cursor, *, lifetime: float, slot=None) -> AsyncIterator[str]:
    loop = asyncio.get_running_loop()
    subscriber = Subscriber(job_id=job_id, cursor=cursor, loop=loop, slot=slot)
    HUB.subscribe(subscriber)
    try:
        yield f"retry: {RETRY_MILLISECONDS}\n\n"
        deadline = loop.time() + lifetime
        keepalive_at = loop.time() + KEEPALIVE_SECONDS
        while True:
            now = loop.time()
            if now >= deadline:
                return
            if now >= keepalive_at:
                keepalive_at = now + KEEPALIVE_SECONDS
                yield ": keepalive\n\n"
            try:
                message = await asyncio.wait_for(
                    subscriber.queue.get(), min(deadline, keepalive_at) - now
                )
            except TimeoutError:
                continue
            if message is END:
                return
            yield message
    finally:
        HUB.unsubscribe(subscriber)  # also gives the slot back (from the poller's thread)
