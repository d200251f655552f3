"""The telemetry's periodic task: series of jobs ended past the retention are removed."""

from __future__ import annotations

from datetime import timedelta

from celery import shared_task
from django.conf import settings
from django.utils import timezone

from apps.jobs.models import JOB_TERMINAL
from apps.platform.names import Task
from apps.telemetry.models import GpuSeries


def purge(now=None) -> int:
    """Delete the GPU series of jobs that ended more than GPUPLATFORM_TELEMETRY_RETENTION_DAYS
    ago (their summaries stay with the job); the number removed."""
    now = now or timezone.now()
    cutoff = now - timedelta(days=settings.TELEMETRY_RETENTION_DAYS)
    _, deleted = GpuSeries.objects.filter(
        job__state__in=JOB_TERMINAL, job__finished_at__lt=cutoff
    ).delete()
    return deleted.get(GpuSeries._meta.label, 0)  # its points go with it


@shared_task(name=Task.PURGE_TELEMETRY, ignore_result=True)
def purge_telemetry() -> int:
    return purge()
