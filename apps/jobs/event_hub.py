"""One poller per web process for every open event stream (`apps.jobs.events_api`).

The streams themselves are coroutines on the ASGI server's event loop that only wait on a
queue; this module's one thread does all their database and log-file reads. Each tick (every
`POLL_SECONDS`, only while a stream is open) it reads the watched jobs in one statement and
the newest state event of each in another, whatever the number of clients; a client costs a
further read only when its job has something new for it (a state event past its cursor, a log
that grew, a new attempt). It also renews the streams' slot leases (apps/jobs/stream_slots.py)
and releases those of closed streams.

Polling rather than Redis pub/sub: every writer (transitions, the agents' log uploads) would
have to publish, and a subscriber still reads the database to catch up from its cursor; one
poller per process gives the same load whatever the number of clients and needs nothing else
running.
"""

from __future__ import annotations

import asyncio
import json
import logging
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

from django.core.files.storage import default_storage
from django.db import close_old_connections, connections
from django.db.models import Max

from apps.jobs import stream_slots
from apps.jobs.arrays import ENDED_KIND as ARRAY_ENDED  # a job array's end
from apps.jobs.models import JOB_TERMINAL, Job, JobEvent, JobState
from apps.platform import events
from apps.platform.names import GPU_IDLE_KIND  # a job's GPUs sat idle (apps/telemetry/idle.py)
from apps.scheduling.core import waiting

logger = logging.getLogger(__name__)

ESTIMATE_FIELDS = ("planned_start_at", "planned_start_earliest", "planned_start_latest",
                   "planned_position", "planned_at")  # fmt: skip
POLL_SECONDS = 0.5
LOG_CHUNK_BYTES = 64 * 1024
JOB_FIELDS = ("pk", "state", "progress", "attempts_count", "exit_code", "reason",
              *ESTIMATE_FIELDS)  # fmt: skip
END = None  # put on a stream's queue after its last message
STREAMED = ("state", ARRAY_ENDED, GPU_IDLE_KIND)
GPU_BACKLOG_SECONDS = 30


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


@dataclass(eq=False)
class Subscriber:
    """One open stream: its job, where it is, and the queue its coroutine reads."""

    job_id: object
    cursor: Cursor
    loop: asyncio.AbstractEventLoop
    slot: stream_slots.Slot | None = None
    queue: asyncio.Queue = field(default_factory=asyncio.Queue)
    progress: object = field(default=None)
    estimate: tuple = ()  # the queued job's plan and reason when this stream last sent them
    seen_event: int = -1  # the job's newest state event when this stream last read events
    seen_log: tuple = ()  # (attempts, size of the current attempt's log) when it last read logs
    # GPU samples sent up to here (Unix time): a new stream starts a little before it opened
    # (the page reads the history from the metrics endpoint, and drops what it has).
    gpu_mark: float = field(default_factory=lambda: time.time() - GPU_BACKLOG_SECONDS)

    def push(self, item: str | None) -> None:
        try:
            self.loop.call_soon_threadsafe(self.queue.put_nowait, item)
        except RuntimeError:
            pass  # its loop is closed: the stream is gone


class Hub:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._subscribers: set[Subscriber] = set()
        self._releases: list[stream_slots.Slot] = []
        self._thread: threading.Thread | None = None
        self._wake = threading.Event()  # a new stream gets its backlog now, not at the next tick
        self._renewed_at = 0.0

    def subscribe(self, subscriber: Subscriber) -> None:
        with self._lock:
            self._subscribers.add(subscriber)
            self._wake.set()
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="event-hub", daemon=True)
                self._thread.start()

    def unsubscribe(self, subscriber: Subscriber) -> None:
        """From the stream's coroutine (its `finally`): no I/O here, the poller releases the slot."""
        with self._lock:
            if subscriber in self._subscribers:
                self._subscribers.discard(subscriber)
                if subscriber.slot is not None:
                    self._releases.append(subscriber.slot)
            if self._thread is None and self._releases:
                self._thread = threading.Thread(target=self._run, name="event-hub", daemon=True)
                self._thread.start()

    def _run(self) -> None:
        try:
            while True:
                with self._lock:
                    subscribers, releases = list(self._subscribers), self._releases
                    self._releases = []
                    self._wake.clear()  # under the lock: a stream added after this wakes the wait
                    if not subscribers and not releases:
                        self._thread = None
                        return
                self._release(releases)
                if subscribers:
                    self._guarded(self._tick, subscribers)
                    self._renew(subscribers)
                    self._wake.wait(POLL_SECONDS)
        finally:
            connections.close_all()  # this thread's; a later poller opens its own

    def _guarded(self, step, *args) -> None:
        try:
            step(*args)
        except Exception:
            logger.exception("event streams: a poll failed; the next one tries again")

    def _release(self, slots: list[stream_slots.Slot]) -> None:
        if slots:
            self._guarded(stream_slots.release, slots)

    def _renew(self, subscribers: list[Subscriber]) -> None:
        now = time.monotonic()
        if now - self._renewed_at < stream_slots.RENEW_SECONDS:
            return
        self._renewed_at = now
        slots = [s.slot for s in subscribers if s.slot is not None]
        if slots:
            self._guarded(stream_slots.renew, slots)

    def _tick(self, subscribers: list[Subscriber]) -> None:
        close_old_connections()  # honours CONN_MAX_AGE and drops a broken connection
        ids = {s.job_id for s in subscribers}
        # Jobs first, then events: a job read as terminal has all its events committed.
        jobs = {row["pk"]: row for row in Job.objects.filter(pk__in=ids).values(*JOB_FIELDS)}
        newest = dict(
            JobEvent.objects.filter(job_id__in=ids, kind__in=STREAMED)
            .values_list("job_id")
            .annotate(Max("pk"))
        )
        sizes: dict[str, int] = {}
        samples = gpu_samples(subscribers, jobs)
        for subscriber in subscribers:
            job = jobs.get(subscriber.job_id)
            if job is None:
                self._finish(subscriber)
                continue
            for message in messages_for(subscriber, job, newest.get(subscriber.job_id, 0), sizes):
                subscriber.push(message)
            new = [s for s in samples.get(subscriber.job_id, ()) if s["at"] > subscriber.gpu_mark]
            if new:  # `gpu`: {"samples": [{t, node, index, util, memory_mib}, ...]}
                subscriber.gpu_mark = new[-1]["at"]
                subscriber.push(sse("gpu", {"samples": [{k: v for k, v in s.items() if k != "at"}
                                                        for s in new]}, subscriber.cursor))  # fmt: skip
            if job["state"] in JOB_TERMINAL:
                self._finish(subscriber)

    def _finish(self, subscriber: Subscriber) -> None:
        subscriber.push(END)
        self.unsubscribe(subscriber)


HUB = Hub()


def gpu_samples(subscribers: list[Subscriber], jobs: dict) -> dict:
    """The new GPU samples of the running jobs streamed (apps/telemetry answers): one read a
    tick, and only while such a stream is open."""
    after: dict = {}
    for subscriber in subscribers:
        job = jobs.get(subscriber.job_id)
        if job is not None and job["state"] == JobState.RUNNING:
            mark = after.get(subscriber.job_id, subscriber.gpu_mark)
            after[subscriber.job_id] = min(mark, subscriber.gpu_mark)
    found: dict = {}
    if after:
        for answer in events.emit(events.GpuSamplesWanted(after=after)):
            found.update(answer)
    return found


def messages_for(
    subscriber: Subscriber, job: dict, newest_event: int, sizes: dict[str, int]
) -> Iterator[str]:
    """What is new for one stream, in the order the per-client loop sent it: states, progress,
    log lines, then `end` for a terminal job."""
    cursor, terminal = subscriber.cursor, job["state"] in JOB_TERMINAL
    if newest_event != subscriber.seen_event:
        subscriber.seen_event = newest_event
        if newest_event > cursor.event_id:
            yield from state_events(subscriber.job_id, cursor)
    if job["state"] == JobState.QUEUED:
        yield from estimate_event(subscriber, job, cursor)
    if job["progress"] != subscriber.progress:
        subscriber.progress = job["progress"]
        yield sse("progress", {"progress": job["progress"], "state": job["state"]}, cursor)
    log_mark = (
        job["attempts_count"],
        _log_size(subscriber.job_id, cursor.attempt, sizes),
        terminal,
    )
    if log_mark != subscriber.seen_log:
        subscriber.seen_log = log_mark
        yield from log_events(
            subscriber.job_id, cursor, attempts=job["attempts_count"], final=terminal
        )
        unread = _log_size(subscriber.job_id, cursor.attempt, sizes) - cursor.offset
        if cursor.attempt < job["attempts_count"] or unread >= LOG_CHUNK_BYTES:
            subscriber.seen_log = ()  # it stopped at a chunk: read on next tick
    if terminal:
        yield sse("end", {"state": job["state"], "exit_code": job["exit_code"]}, cursor)


def estimate_event(subscriber: Subscriber, job: dict, cursor: Cursor) -> Iterator[str]:
    """`estimate`: a queued job's start estimate from the dispatcher's plan (apps/scheduling/
    plan.py), as a time and in words ("in ~12 min, likely 8-20 min"), with its queue position
    and reason, whenever one of them changes."""
    mark = (job["reason"], *(job[name] for name in ESTIMATE_FIELDS))
    if mark == subscriber.estimate or job["planned_at"] is None:
        return
    subscriber.estimate = mark
    start, earliest, latest = (
        job[f"planned_start_{part}"] for part in ("at", "earliest", "latest")
    )
    stamp = waiting.iso
    yield sse("estimate", {
        "estimated_start_at": stamp(start) if start else None,
        "estimated_start_window": [stamp(earliest) if earliest else None,
                                   stamp(latest) if latest else None] if start else None,
        "in": waiting.window_words(start, earliest, latest),
        "queue_position": job["planned_position"],
        "reason": waiting.with_relative(job["reason"]),
    }, cursor)  # fmt: skip


def state_events(job_id, cursor: Cursor) -> Iterator[str]:
    # Ids follow commit order per job: every transition updates the job row first (a row lock).
    rows = (
        JobEvent.objects.filter(job_id=job_id, kind__in=STREAMED, pk__gt=cursor.event_id)
        .order_by("pk")
        .values(
            "pk",
            "kind",
            "from_state",
            "to_state",
            "reason",
            "actor",
            "created_at",
            "attempt__number",
            "data",
        )
    )
    for row in rows:
        cursor.event_id = row["pk"]
        if row["kind"] == ARRAY_ENDED:  # the job array ended with this task (docs/arrays.md)
            yield sse("array.ended", {**row["data"], "at": row["created_at"].isoformat()}, cursor)
            continue
        if row["kind"] == GPU_IDLE_KIND:  # {job, idle_minutes, limit_minutes, action}
            yield sse(GPU_IDLE_KIND, {**row["data"], "reason": row["reason"],
                                      "at": row["created_at"].isoformat()}, cursor)  # fmt: skip
            continue
        yield sse("state", {
            "from": row["from_state"] or None, "to": row["to_state"], "reason": row["reason"],
            "actor": row["actor"], "at": row["created_at"].isoformat(), "attempt": row["attempt__number"],
        }, cursor)  # fmt: skip


def log_events(job_id, cursor: Cursor, *, attempts: int, final: bool) -> Iterator[str]:
    """New whole lines of each attempt's log since the cursor; the last partial line only when
    the job is over (it will not grow any more)."""
    while cursor.attempt <= attempts:
        data = _read_from(_log_name(job_id, cursor.attempt), cursor.offset)
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


def _log_name(job_id, attempt: int) -> str:
    return f"logs/{job_id}/attempt-{attempt}.log"


def _log_size(job_id, attempt: int, sizes: dict[str, int]) -> int:
    """The log's size, once a tick per file however many streams follow it."""
    name = _log_name(job_id, attempt)
    if name not in sizes:
        sizes[name] = default_storage.size(name) if default_storage.exists(name) else -1
    return sizes[name]


def _read_from(name: str, offset: int) -> bytes:
    if not default_storage.exists(name):
        return b""
    with default_storage.open(name, "rb") as handle:
        handle.seek(offset)
        return handle.read(LOG_CHUNK_BYTES)
