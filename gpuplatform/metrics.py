"""`/metrics` in Prometheus text format, computed from the database at scrape time so every
web process answers the same."""

from django.db.models import Count
from django.http import HttpResponse
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Gauge, generate_latest

from apps.jobs.models import GpuAllocation, Job, JobState
from apps.nodes.models import Gpu


def metrics(request):
    registry = CollectorRegistry()
    jobs = Gauge("gpuplatform_jobs", "Jobs by state", ["state"], registry=registry)
    counts = dict(Job.objects.values_list("state").annotate(n=Count("pk")))
    for state in JobState.values:
        jobs.labels(state).set(counts.get(state, 0))
    queued = Gauge("gpuplatform_queue_depth", "Queued jobs by tier and SKU", ["tier", "sku"], registry=registry)
    for tier, sku, n in (
        Job.objects.filter(state=JobState.QUEUED).values_list("tier__name", "gpu_sku__name").annotate(n=Count("pk"))
    ):
        queued.labels(tier, sku or "any").set(n)
    total = Gauge("gpuplatform_gpus_total", "GPUs by SKU", ["sku"], registry=registry)
    for sku, n in Gpu.objects.values_list("node__sku__name").annotate(n=Count("pk")):
        total.labels(sku).set(n)
    allocated = Gauge("gpuplatform_gpus_allocated", "Allocated GPUs by SKU", ["sku"], registry=registry)
    for sku, n in GpuAllocation.objects.filter(released_at=None).values_list("gpu__node__sku__name").annotate(n=Count("pk")):
        allocated.labels(sku).set(n)
    return HttpResponse(generate_latest(registry), content_type=CONTENT_TYPE_LATEST)
