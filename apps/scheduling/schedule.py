"""The beat schedule, in one place. Each entry expires so a backlog never replays old ticks."""

from django.conf import settings

from apps.platform.names import Queue, Task


def beat_schedule() -> dict:
    return {
        # Safety net: submits, finishes and node changes already trigger a pass.
        "dispatch": {
            "task": Task.DISPATCH,
            "schedule": settings.DISPATCH_TICK_SECONDS,
            "options": {"queue": Queue.CONTROL, "expires": settings.DISPATCH_TICK_SECONDS * 2},
        },
        # Lost nodes, expired leases, attempts whose start message was lost.
        "reconcile": {
            "task": Task.RECONCILE,
            "schedule": settings.RECONCILE_TICK_SECONDS,
            "options": {"queue": Queue.CONTROL, "expires": settings.RECONCILE_TICK_SECONDS * 2},
        },
        # Webhook outbox: one signed POST per job state change, retried with backoff (apps/webhooks).
        # On the webhooks worker, not the dispatcher's: it fans out one deliver task per webhook.
        "webhooks": {
            "task": Task.WEBHOOKS_PUMP,
            "schedule": 2.0,
            "options": {"queue": Queue.WEBHOOKS, "expires": 4.0},
        },
        # Per-SKU autoscaling (apps/scheduling/autoscaling.py); a no-op while every policy is off.
        "autoscale": {
            "task": Task.AUTOSCALE,
            "schedule": settings.AUTOSCALE_TICK_SECONDS,
            "options": {"queue": Queue.CONTROL, "expires": settings.AUTOSCALE_TICK_SECONDS * 2},
        },
        # Code bundles no live job uses, past GPUPLATFORM_BUNDLE_RETENTION_DAYS (apps/bundles).
        "expire-bundles": {
            "task": Task.EXPIRE_BUNDLES,
            "schedule": settings.BUNDLE_EXPIRE_TICK_SECONDS,
            "options": {"queue": Queue.CONTROL, "expires": settings.BUNDLE_EXPIRE_TICK_SECONDS},
        },
        # GPU series of jobs ended past GPUPLATFORM_TELEMETRY_RETENTION_DAYS (apps/telemetry).
        "purge-telemetry": {
            "task": Task.PURGE_TELEMETRY,
            "schedule": 3600.0,
            "options": {"queue": Queue.CONTROL, "expires": 3600.0},
        },
    }
