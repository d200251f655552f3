"""Figures the dispatcher and admission leave in Redis for `/metrics` (gpuplatform/metrics.py
reads them at scrape time, so every web process answers the same). Recording never fails the
work it measures."""

from __future__ import annotations

import logging
import time

from apps.scheduling.redis import client

log = logging.getLogger(__name__)

DISPATCH_KEY = "gpuplatform:metrics:dispatch"
REJECTIONS_KEY = "gpuplatform:metrics:admission_rejections"


def record_dispatch_pass(seconds: float, *, fragmentation: float | None = None) -> None:
    """Called by the dispatcher after each pass, with the kept cluster's fragmentation when it
    measured it (apps/scheduling/tasks.py: at most every FRAGMENTATION_EVERY_S); never fails the
    pass."""
    try:
        pipe = client().pipeline()
        figures = {"last_seconds": seconds, "last_at": time.time()}
        if fragmentation is not None:
            figures["fragmentation"] = fragmentation
        pipe.hset(DISPATCH_KEY, mapping=figures)
        pipe.hincrbyfloat(DISPATCH_KEY, "seconds_total", seconds)
        pipe.hincrby(DISPATCH_KEY, "passes_total", 1)
        pipe.execute()
    except Exception:
        log.debug("could not record the dispatch pass duration", exc_info=True)


def record_admission_rejection(reason: str) -> None:
    """For admission control: count a refused submission under a short reason
    ("queue_full", "rate_limited", "gpu_cap", ...)."""
    try:
        client().hincrby(REJECTIONS_KEY, reason[:64], 1)
    except Exception:
        log.debug("could not count an admission rejection", exc_info=True)
