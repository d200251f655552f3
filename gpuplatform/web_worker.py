"""gunicorn's worker for the ASGI web (`-k gpuplatform.web_worker.Worker`): uvicorn's, with
gunicorn's `--threads` sizing the pool that serves the sync views (gpuplatform/asgi.py), and
uvicorn's proxy-header rewriting off, as under gunicorn's own workers: the client address is the
socket's (sign-in throttling counts by it), and the scheme behind a proxy is Django's
SECURE_PROXY_SSL_HEADER's business."""

import os

from uvicorn_worker import UvicornWorker


class Worker(UvicornWorker):
    CONFIG_KWARGS = {
        "loop": "auto",
        "http": "auto",
        "proxy_headers": False,
        "server_header": False,  # gunicorn's workers named themselves; nothing needs it
        # On SIGTERM open event streams are cut after 5 s (their clients reconnect to another
        # worker) instead of holding the restart for gunicorn's graceful timeout.
        "timeout_graceful_shutdown": 5,
    }

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        os.environ.setdefault("GPUPLATFORM_WEB_THREADS", str(max(1, self.cfg.threads)))
