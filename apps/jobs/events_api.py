"""`GET /api/v1/jobs/{id}/events/`: a job's life as Server-Sent Events, for programs.

Events: `state` (one per audit-log transition, in order), `progress` (when it changes), `log`
(one per output line of the current attempt) and `end` (the job is terminal; the stream
closes). Each message's `id` is a cursor (`<audit event id>.<attempt>.<log offset>`), so a
client that reconnects with `Last-Event-ID` resumes where it left off without repeats.

A stream holds one web thread, so it lives a bounded time (`?timeout=`, default 30 s, at most
120 s) and then closes; EventSource clients reconnect on their own. The database is polled:
every web process answers the same, and nothing extra has to run.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from dataclasses import dataclass

from django.core.files.storage import default_storage
from django.http import StreamingHttpResponse
from django.shortcuts import get_object_or_404
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework.renderers import BaseRenderer, JSONRenderer
from rest_framework.views import APIView

from apps.jobs.access import visible_jobs
from apps.jobs.models import JOB_TERMINAL, Job, JobEvent

POLL_SECONDS = 0.5
KEEPALIVE_SECONDS = 10
DEFAULT_LIFETIME_SECONDS = 30
MAX_LIFETIME_SECONDS = 120
LOG_CHUNK_BYTES = 64 * 1024
RETRY_MILLISECONDS = 1000


class EventStreamRenderer(BaseRenderer):
    """Lets DRF accept `Accept: text/event-stream`; used only for errors (401, 404)."""

    media_type = "text/event-stream"
    format = "sse"

    def render(self, data, accepted_media_type=None, renderer_context=None) -> bytes:
        return f"event: error\ndata: {json.dumps(data, default=str)}\n\n".encode()


@dataclass
class Cursor:
    event_id: int = 0
    attempt: int = 1
    offset: int = 0

    @classmethod
    def parse(cls, value: str | None) -> Cursor:
        try:
            event_id, attempt, offset = (int(part) for part in (value or "").split("."))
        except ValueError:
            return cls()
        return cls(max(0, event_id), max(1, attempt), max(0, offset))

    def __str__(self) -> str:
        return f"{self.event_id}.{self.attempt}.{self.offset}"


def sse(event: str, data: dict, cursor: Cursor) -> str:
    return f"id: {cursor}\nevent: {event}\ndata: {json.dumps(data, default=str)}\n\n"


def lifetime_from(raw: str | None) -> float:
    try:
        seconds = float(raw) if raw else DEFAULT_LIFETIME_SECONDS
    except ValueError:
        seconds = DEFAULT_LIFETIME_SECONDS
    if seconds != seconds:  # NaN
        seconds = DEFAULT_LIFETIME_SECONDS
    return min(MAX_LIFETIME_SECONDS, max(1.0, seconds))


class JobEventsView(APIView):
    renderer_classes = [JSONRenderer, EventStreamRenderer]

    @extend_schema(
        parameters=[OpenApiParameter("timeout", float, description="seconds before the server closes (1-120)")],
        responses={(200, "text/event-stream"): str},
    )
    def get(self, request, pk):
        job = get_object_or_404(visible_jobs(request.user), pk=pk)
        cursor = Cursor.parse(request.headers.get("Last-Event-ID") or request.query_params.get("last_event_id"))
        lifetime = lifetime_from(request.query_params.get("timeout"))
        response = StreamingHttpResponse(job_stream(job.pk, cursor, lifetime=lifetime), content_type="text/event-stream")
        response["Cache-Control"] = "no-cache"
        response["X-Accel-Buffering"] = "no"  # a proxy in front must not hold the stream back
        return response


def job_stream(job_id, cursor: Cursor, *, lifetime: float) -> Iterator[str]:
    yield f"retry: {RETRY_MILLISECONDS}\n\n"
    deadline = time.monotonic() + lifetime
    keepalive_at = time.monotonic() + KEEPALIVE_SECONDS
    progress = None
    while True:
        job = Job.objects.filter(pk=job_id).values("state", "progress", "attempts_count", "exit_code").first()
        if job is None:
            return
        terminal = job["state"] in JOB_TERMINAL  # read before the events, so none is missed
        yield from state_events(job_id, cursor)
        if job["progress"] != progress:
            progress = job["progress"]
            yield sse("progress", {"progress": progress, "state": job["state"]}, cursor)
        yield from log_events(job_id, cursor, attempts=job["attempts_count"], final=terminal)
        if terminal:
            yield sse("end", {"state": job["state"], "exit_code": job["exit_code"]}, cursor)
            return
        now = time.monotonic()
        if now >= deadline:
            return
        if now >= keepalive_at:
            keepalive_at = now + KEEPALIVE_SECONDS
            yield ": keepalive\n\n"
        time.sleep(POLL_SECONDS)


def state_events(job_id, cursor: Cursor) -> Iterator[str]:
    # Ids follow commit order per job: every transition updates the job row first (a row lock).
    rows = (
        JobEvent.objects.filter(job_id=job_id, kind="state", pk__gt=cursor.event_id)
        .order_by("pk")
        .values("pk", "from_state", "to_state", "reason", "actor", "created_at", "attempt__number")
    )
    for row in rows:
        cursor.event_id = row["pk"]
        yield sse("state", {
            "from": row["from_state"] or None, "to": row["to_state"], "reason": row["reason"],
            "actor": row["actor"], "at": row["created_at"].isoformat(), "attempt": row["attempt__number"],
        }, cursor)  # fmt: skip


def log_events(job_id, cursor: Cursor, *, attempts: int, final: bool) -> Iterator[str]:
    """New whole lines of each attempt's log since the cursor; the last partial line only when
    the job is over (it will not grow any more)."""
    while cursor.attempt <= attempts:
        name = f"logs/{job_id}/attempt-{cursor.attempt}.log"
        data = _read_from(name, cursor.offset)
        last_attempt = cursor.attempt == attempts
        complete = (final or not last_attempt) and len(data) < LOG_CHUNK_BYTES
        end = len(data) if complete else data.rfind(b"\n") + 1
        if end == 0 and len(data) >= LOG_CHUNK_BYTES:
            end = len(data)  # one line longer than a chunk: send it in pieces
        for line in data[:end].splitlines(keepends=True):
            cursor.offset += len(line)
            text = line.decode("utf-8", errors="replace").rstrip("\r\n")
            yield sse("log", {"attempt": cursor.attempt, "line": text}, cursor)
        if len(data) >= LOG_CHUNK_BYTES:
            return  # more next poll
        if last_attempt:
            return
        cursor.attempt, cursor.offset = cursor.attempt + 1, 0


def _read_from(name: str, offset: int) -> bytes:
    if not default_storage.exists(name):
        return b""
    with default_storage.open(name, "rb") as handle:
        handle.seek(offset)
        return handle.read(LOG_CHUNK_BYTES)
