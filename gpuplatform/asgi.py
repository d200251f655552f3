"""ASGI entry point for the web (`gunicorn gpuplatform.asgi:application -k gpuplatform.web_worker.Worker`).

One server, one port: the event streams (`/api/v1/jobs/{id}/events/`) go to Django's ASGI
handler, whose async stream waits on the event loop and holds no thread; every other request
goes to Django's WSGI handler on a fixed pool of threads, as under gunicorn's gthread workers.

Why not Django's ASGI handler for everything: it runs each request's sync code in a thread of
its own, so every request would open a new database connection with a cold page cache (about
twice a submit's CPU on SQLite, see gpuplatform/settings.py on CONN_MAX_AGE), where the pool's
threads keep theirs. Why not a2wsgi's bridge as it is: it hands a response across threads part
by part (its start, then each chunk, a hop each); here the request body is read on the loop
first and the app runs, response and all, in one hop to the pool, unless the response is large
(a file download), whose further chunks then come a hop each.
"""

import asyncio
import os
import re
import tempfile
from concurrent.futures import ThreadPoolExecutor

from a2wsgi.wsgi import build_environ

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "gpuplatform.settings")

from django.core.asgi import get_asgi_application  # noqa: E402
from django.core.wsgi import get_wsgi_application  # noqa: E402
from django.urls import reverse  # noqa: E402

STREAMS = re.compile(r"^/api/v1/jobs/[^/]+/events/$")
# An agent that goes unanswered for its fence window kills its jobs (workers/agent.py): its
# heartbeat must never queue behind a burst of submits holding every thread of the pool, so
# heartbeats (and registrations, so an agent's restart is seen at once) have a pool of their own
# in each worker, as large as the other: on SQLite each waits for the one write lock, and a
# single thread made every node's heartbeat wait for the others'.
LIVENESS = re.compile(r"^/internal/agent/v1/(heartbeat|register)/$")
BODY_IN_MEMORY = 1024 * 1024  # a larger request body spills to a temporary file
GATHER_BYTES = 256 * 1024  # a response up to this size is built in one hop


def build(wsgi_app, *, threads: int | None = None):
    """The router over a WSGI app (the platform's, or the bench's with its extra URLs)."""
    threads = threads or int(os.environ.get("GPUPLATFORM_WEB_THREADS") or 4)
    pool = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="wsgi")
    liveness = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="wsgi-liveness")
    streams = get_asgi_application()

    async def application(scope, receive, send):
        if scope["type"] == "http" and STREAMS.match(scope["path"]):
            await streams(scope, receive, send)
        elif scope["type"] == "http":
            lane = liveness if LIVENESS.match(scope["path"]) else pool
            await serve_wsgi(wsgi_app, lane, scope, receive, send)
        elif scope["type"] == "websocket":
            await relay.serve(scope, receive, send)  # sessions: gpuplatform/relay.py
        elif scope["type"] == "lifespan":
            await lifespan(receive, send)

    return application


async def serve_wsgi(app, pool: ThreadPoolExecutor, scope, receive, send) -> None:
    body = await read_body(receive)
    if body is None:
        return  # the client went away before sending it all
    environ = build_environ(scope, body)
    if "CONTENT_LENGTH" not in environ and (size := body.seek(0, os.SEEK_END)):
        # A chunked body (no Content-Length): Django reads as many bytes as CONTENT_LENGTH says,
        # so without it a view would see an empty body. It is all here now: say how much.
        environ["CONTENT_LENGTH"] = str(size)
    body.seek(0)
    loop = asyncio.get_running_loop()
    try:
        status, headers, parts, rest = await loop.run_in_executor(pool, run_app, app, environ)
    finally:
        body.close()
    await send({"type": "http.response.start", "status": status, "headers": headers})
    if rest is None:
        await send({"type": "http.response.body", "body": b"".join(parts)})
        return
    try:
        await send({"type": "http.response.body", "body": b"".join(parts), "more_body": True})
        while (chunk := await loop.run_in_executor(pool, next, rest, None)) is not None:
            await send({"type": "http.response.body", "body": chunk, "more_body": True})
        await send({"type": "http.response.body", "body": b""})
    finally:
        await loop.run_in_executor(pool, close, rest)


async def read_body(receive):
    body = tempfile.SpooledTemporaryFile(max_size=BODY_IN_MEMORY)
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            body.close()
            return None
        body.write(message.get("body", b""))
        if not message.get("more_body"):
            body.seek(0)
            return body


def run_app(app, environ):
    """On a pool thread: the app's status, headers and first parts, and an iterator over the
    rest when the response is larger than GATHER_BYTES (None when it was all read)."""
    started = {}
    parts: list[bytes] = []

    def start_response(status, headers, exc_info=None):
        started["status"], started["headers"] = status, headers
        return parts.append  # the old-style write() callable

    result = app(environ, start_response)
    iterator, size = iter(result), 0
    try:
        for part in iterator:
            parts.append(part)
            size += len(part)
            if size > GATHER_BYTES:
                return (*_head(started), parts, _rest(iterator, result))
    except BaseException:
        close(result)
        raise
    close(result)
    return (*_head(started), parts, None)


def _head(started: dict) -> tuple[int, list]:
    headers = [
        (name.lower().encode("latin1"), value.encode("latin1"))
        for name, value in started["headers"]
    ]
    return int(started["status"].split(" ", 1)[0]), headers


class _rest:
    """The rest of a large response, and the WSGI result to close when done."""

    def __init__(self, iterator, result):
        self.iterator, self.result = iterator, result

    def __next__(self):
        return next(self.iterator)

    def close(self):
        close(self.result)


def close(result) -> None:
    if hasattr(result, "close"):
        result.close()


async def lifespan(receive, send) -> None:
    while True:
        message = await receive()
        if message["type"] == "lifespan.startup":
            await send({"type": "lifespan.startup.complete"})
        elif message["type"] == "lifespan.shutdown":
            await send({"type": "lifespan.shutdown.complete"})
            return


application = build(get_wsgi_application())
from gpuplatform import relay  # noqa: E402 (its models need the apps loaded, just above)

# The URLconf, and with it every view, DRF and the schema's modules, imported as the worker
# starts, not by the first request it serves: that request took ~0.5 s longer (a submit's).
reverse("healthz")
