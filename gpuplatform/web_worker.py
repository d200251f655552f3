"""gunicorn's worker for the ASGI web (`-k gpuplatform.web_worker.Worker`): uvicorn's, with
gunicorn's `--threads` sizing the pool that serves the sync views (gpuplatform/asgi.py), and
uvicorn's proxy-header rewriting off, as under gunicorn's own workers: the client address is the
socket's (sign-in throttling counts by it), and the scheme behind a proxy is Django's
SECURE_PROXY_SSL_HEADER's business.

The GIL's switch interval is cut from Python's 5 ms: the event loop's one thread reads and
writes every connection of the worker, and while the pool's threads run views it waited up to
5 ms for the GIL at each step of each request (read, hand to the pool, send), so the worker
served far fewer requests than gunicorn's gthread worker did on the same cores (a submit burst
while agents report: about 14 submits/s at 5 ms, 50-70 at 0.5 ms; bench/foundation.py). Measured
again beside 2 and 5 ms (docs/bench/71-slurm-peer-notes.md, h36web pass): 2 ms no better, 5 ms
still worse; it stays.

The event loop and the HTTP parser are named, not left to uvicorn's "auto": auto falls back to
asyncio's loop and the pure-Python h11 parser when uvloop or httptools is missing, and the server's
own CPU a request then grows by a third (asyncio) to three quarters (h11), with nothing said. A
web without them now refuses to start instead (both are in requirements.txt)."""

import logging
import os
import sys

from uvicorn_worker import UvicornWorker

SWITCH_INTERVAL_SECONDS = 0.0005
AGENT_API = "/internal/agent/"


class QuietAgentAccess(logging.Filter):
    """Drops the access lines of the agent API (heartbeats and reports: nine in ten of a running
    platform's lines, which scrolled `make run`'s demo tokens away) unless
    GPUPLATFORM_AGENT_ACCESS_LOG=1. Uvicorn's access record carries (client, method, path,
    HTTP version, status) as its arguments; a failed agent call still logs as an error."""

    def filter(self, record: logging.LogRecord) -> bool:
        args = record.args
        if not isinstance(args, tuple) or len(args) < 5:
            return True
        path, status = str(args[2]), args[4]
        return not (path.startswith(AGENT_API) and isinstance(status, int) and status < 400)


def quiet_agent_access(logger: logging.Logger) -> None:
    if os.environ.get("GPUPLATFORM_AGENT_ACCESS_LOG", "") not in ("1", "true", "yes", "on"):
        logger.addFilter(QuietAgentAccess())


class Worker(UvicornWorker):
    CONFIG_KWARGS = {
        "loop": "uvloop",
        "http": "httptools",
        "proxy_headers": False,
        "server_header": False,  # gunicorn's workers named themselves; nothing needs it
        # On SIGTERM open event streams are cut after 5 s (their clients reconnect to another
        # worker) instead of holding the restart for gunicorn's graceful timeout.
        "timeout_graceful_shutdown": 5,
        # Sessions (gpuplatform/relay.py): frames of at most 256 KiB of data, a few queued per
        # socket before uvicorn stops reading it (backpressure to the sender).
        "ws_max_size": 512 * 1024,
        "ws_max_queue": 4,
    }

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        os.environ.setdefault("GPUPLATFORM_WEB_THREADS", str(max(1, self.cfg.threads)))
        sys.setswitchinterval(SWITCH_INTERVAL_SECONDS)
        quiet_agent_access(logging.getLogger("uvicorn.access"))
