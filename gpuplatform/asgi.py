"""ASGI entry point for the web (`gunicorn gpuplatform.asgi:application -k gpuplatform.web_worker.Worker`).

One server, one port: the event streams (`/api/v1/jobs/{id}/events/`) go to Django's ASGI
handler, whose async stream waits on the event loop and holds no thread; every other request
goes to Django's WSGI handler on a fixed pool of threads (a2wsgi), as under gunicorn's threads.
Why not Django's ASGI handler for everything: it runs each request's sync code in a thread of
its own, so every request would open a new database connection with a cold page cache (about
twice a submit's CPU on SQLite, see gpuplatform/settings.py on CONN_MAX_AGE), where the pool's
threads keep theirs.
"""

import os
import re

from a2wsgi import WSGIMiddleware

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "gpuplatform.settings")

from django.core.asgi import get_asgi_application  # noqa: E402
from django.core.wsgi import get_wsgi_application  # noqa: E402

STREAMS = re.compile(r"^/api/v1/jobs/[^/]+/events/$")


def build(wsgi_app, *, threads: int | None = None):
    """The router over a WSGI app (the platform's, or the bench's with its extra URLs)."""
    threads = threads or int(os.environ.get("GPUPLATFORM_WEB_THREADS") or 4)
    pool = WSGIMiddleware(wsgi_app, workers=threads)
    streams = get_asgi_application()

    async def application(scope, receive, send):
        if scope["type"] == "http" and STREAMS.match(scope["path"]):
            await streams(scope, receive, send)
        else:
            await pool(scope, receive, send)  # http, and lifespan (a2wsgi answers it)

    return application


application = build(get_wsgi_application())
