"""`/metrics` in Prometheus text format, computed from the database (and a few figures the
dispatcher leaves in Redis) at scrape time, so every web process answers the same.

Counters come from durable records (every started job, every preempted attempt), so they only
grow; gauges are what is true now.
"""

from __future__ import annotations

import hmac
import logging
from collections.abc import Iterator
from datetime import timedelta

from django.conf import settings
from django.db.models import Count, DurationField, ExpressionWrapper, F, Q, Sum
from django.http import HttpResponse
from django.utils import timezone
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)

from apps.admission.counters import counters
from apps.jobs.models import AttemptState, GpuAllocation, Job, JobAttempt, JobState
from apps.nodes.models import Gpu, GpuHealth, Node, NodeState
from apps.scheduling.figures import (  # noqa: F401 (record_*: callers import them from here too)
    DISPATCH_KEY,
    REJECTIONS_KEY,
    record_admission_rejection,
    record_dispatch_pass,
)
from apps.scheduling.models import AutoscalePolicy, ProvisionRequest, ProvisionState, ScaleEvent
from apps.scheduling.redis import client
from apps.telemetry.read import running_gauges
from apps.tenants.models import Tier

log = logging.getLogger(__name__)

# created_at -> started_at, in seconds.
WAIT_BUCKETS = (1, 5, 15, 30, 60, 300, 900, 3600, 4 * 3600, 24 * 3600)
# --- figures other processes leave in Redis (recorded by apps/scheduling/figures.py) ---------


def _redis():
    return client()


def _redis_hash(key: str) -> dict[str, str]:
    try:
        return {k.decode(): v.decode() for k, v in _redis().hgetall(key).items()}
    except Exception:
        return {}


# --- the collectors -------------------------------------------------------------------------


def job_metrics() -> Iterator[Metric]:
    jobs = GaugeMetricFamily("gpuplatform_jobs", "Jobs by state", labels=["state"])
    counts = dict(Job.objects.values_list("state").annotate(n=Count("pk")))
    for state in JobState.values:
        jobs.add_metric([state], counts.get(state, 0))
    yield jobs
    depth = GaugeMetricFamily(
        "gpuplatform_queue_depth", "Queued jobs by tier and SKU", labels=["tier", "sku"]
    )
    queued = (
        # Jobs held by their dependencies wait for no GPU (docs/pipelines.md).
        Job.objects.filter(state=JobState.QUEUED, held_by_dependencies=False)
        .values_list("tier__name", "gpu_sku__name")
        .annotate(n=Count("pk"))
    )
    for tier, sku, n in queued:
        depth.add_metric([tier, sku or "any"], n)
    yield depth
    yield wait_histogram()
    preempted = CounterMetricFamily("gpuplatform_preemptions", "Attempts ended by preemption")
    preempted.add_metric([], JobAttempt.objects.filter(state=AttemptState.PREEMPTED).count())
    yield preempted
    lost = CounterMetricFamily(
        "gpuplatform_attempts_lost", "Attempts lost to infrastructure failures"
    )
    lost.add_metric([], JobAttempt.objects.filter(state=AttemptState.LOST).count())
    yield lost


def wait_histogram() -> Metric:
    """Time from submit to first start of every job that has started, per tier."""
    wait = ExpressionWrapper(F("started_at") - F("created_at"), output_field=DurationField())
    aggregates = {
        f"le_{b}": Count("pk", filter=Q(wait__lte=timedelta(seconds=b))) for b in WAIT_BUCKETS
    }
    rows = (
        Job.objects.filter(started_at__isnull=False)
        .annotate(wait=wait)
        .values("tier__name")
        .annotate(total=Count("pk"), wait_sum=Sum("wait"), **aggregates)
    )
    family = HistogramMetricFamily(
        "gpuplatform_job_wait_seconds", "Seconds from submit to start, per tier", labels=["tier"]
    )
    seen = set()
    for row in rows:
        seen.add(row["tier__name"])
        buckets = [(str(float(b)), row[f"le_{b}"]) for b in WAIT_BUCKETS] + [("+Inf", row["total"])]
        total = row["wait_sum"].total_seconds() if row["wait_sum"] else 0.0
        family.add_metric([row["tier__name"]], buckets, max(0.0, total))
    for tier in Tier.objects.exclude(name__in=seen).values_list("name", flat=True):
        family.add_metric([tier], [(str(float(b)), 0) for b in WAIT_BUCKETS] + [("+Inf", 0)], 0.0)
    return family


def fleet_metrics() -> Iterator[Metric]:
    """The fleet now: a node the autoscaler gave back (terminated) is gone, and so are its GPUs
    and its heartbeat age (which would grow for ever); only the count by state still shows it."""
    total = GaugeMetricFamily("gpuplatform_gpus_total", "GPUs by SKU", labels=["sku"])
    present = Gpu.objects.exclude(node__state=NodeState.TERMINATED)
    for sku, n in present.values_list("node__sku__name").annotate(n=Count("pk")):
        total.add_metric([sku], n)
    yield total
    usable = GaugeMetricFamily(
        "gpuplatform_gpus_schedulable", "Healthy GPUs on ready nodes, by SKU", labels=["sku"]
    )
    ready = Gpu.objects.filter(node__state=NodeState.READY, health=GpuHealth.HEALTHY)
    for sku, n in ready.values_list("node__sku__name").annotate(n=Count("pk")):
        usable.add_metric([sku], n)
    yield usable
    allocated = GaugeMetricFamily(
        "gpuplatform_gpus_allocated", "Allocated GPUs by SKU", labels=["sku"]
    )
    held = (
        GpuAllocation.objects.filter(released_at=None)
        .values_list("gpu__node__sku__name")
        .annotate(n=Count("pk"))
    )
    for sku, n in held:
        allocated.add_metric([sku], n)
    yield allocated
    nodes = GaugeMetricFamily("gpuplatform_nodes", "Nodes by state", labels=["state"])
    by_state = dict(Node.objects.values_list("state").annotate(n=Count("pk")))
    for state in NodeState.values:
        if state != NodeState.TERMINATED:
            nodes.add_metric([state], by_state.get(state, 0))
    yield nodes
    # Nodes the autoscaler gave back only ever add up (their rows are kept): a counter, not a
    # gauge state that would grow for as long as the platform runs.
    yield CounterMetricFamily(
        "gpuplatform_nodes_terminated",
        "Nodes given back by the autoscaler's provider",
        value=by_state.get(NodeState.TERMINATED, 0),
    )
    age = GaugeMetricFamily(
        "gpuplatform_node_heartbeat_age_seconds",
        "Seconds since each node's last heartbeat",
        labels=["node"],
    )
    now = timezone.now()
    for name, last in (
        Node.objects.exclude(last_heartbeat_at=None)
        .exclude(state=NodeState.TERMINATED)
        .values_list("name", "last_heartbeat_at")
    ):
        if last is not None:
            age.add_metric([name], max(0.0, (now - last).total_seconds()))
    yield age
    fragmentation = _fragmentation()
    if fragmentation is not None:
        frag = GaugeMetricFamily(
            "gpuplatform_gpu_fragmentation",
            "Share of free GPU capacity the current workload could not use (the scheduling core's measure)",
        )
        frag.add_metric([], fragmentation)
        yield frag


def _fragmentation() -> float | None:
    """As the dispatcher measured it on its kept cluster after a pass (at most every 15 s,
    apps/scheduling/tasks.py), never read here: a read of the whole cluster per scrape cost
    0.7-1.0 s of CPU at 1,000 nodes x 8 GPUs. None (the gauge left out) until a dispatcher has
    measured it."""
    value = _redis_hash(DISPATCH_KEY).get("fragmentation")
    return None if value is None else float(value)


def control_metrics() -> Iterator[Metric]:
    dispatch = _redis_hash(DISPATCH_KEY)
    if dispatch:
        last = GaugeMetricFamily(
            "gpuplatform_dispatch_last_seconds", "Duration of the last dispatcher pass"
        )
        last.add_metric([], float(dispatch.get("last_seconds", 0)))
        yield last
        passes = CounterMetricFamily("gpuplatform_dispatch_passes", "Dispatcher passes run")
        passes.add_metric([], int(dispatch.get("passes_total", 0)))
        yield passes
        spent = CounterMetricFamily(
            "gpuplatform_dispatch_seconds", "Seconds spent in dispatcher passes"
        )
        spent.add_metric([], float(dispatch.get("seconds_total", 0)))
        yield spent
    rejections = CounterMetricFamily(
        "gpuplatform_admission_rejections",
        "Submissions refused by admission control",
        labels=["reason"],
    )
    for reason, n in sorted(_redis_hash(REJECTIONS_KEY).items()):
        rejections.add_metric([reason], int(n))
    yield rejections
    yield admission_counters()


def admission_counters() -> Metric:
    """Admission's own shared counters (apps/admission/counters.py), e.g. submissions admitted
    or refused while Redis was down, `<what>:<tier>`."""
    family = CounterMetricFamily(
        "gpuplatform_admission_events",
        "Admission control events by name and tier",
        labels=["event", "tier"],
    )
    for name, value in sorted(counters().items()):
        event, _, tier = name.partition(":")
        family.add_metric([event, tier], value)
    return family


def autoscale_metrics() -> Iterator[Metric]:
    """Per autoscaled SKU: nodes now, desired by the last decision, provisions pending, and the
    last decision's reason (docs/autoscaling.md)."""
    current = GaugeMetricFamily(
        "gpuplatform_autoscale_nodes", "Nodes of an autoscaled SKU now", labels=["sku"]
    )
    desired = GaugeMetricFamily(
        "gpuplatform_autoscale_desired_nodes", "Desired nodes (last decision)", labels=["sku"]
    )
    pending = GaugeMetricFamily(
        "gpuplatform_autoscale_pending_nodes", "Nodes asked for, not yet there", labels=["sku"]
    )
    decision = GaugeMetricFamily(
        "gpuplatform_autoscale_last_decision",
        "The last decision (value: its time)",
        labels=["sku", "mode", "reason"],
    )
    for policy in AutoscalePolicy.objects.select_related("sku"):
        sku = policy.sku.name
        nodes = Node.objects.filter(sku=policy.sku).exclude(
            state__in=[NodeState.LOST, NodeState.TERMINATED]
        )
        current.add_metric([sku], nodes.count())
        waiting = ProvisionRequest.objects.filter(
            sku=policy.sku, state=ProvisionState.PENDING
        ).count()
        pending.add_metric([sku], waiting)
        last = ScaleEvent.objects.filter(sku=policy.sku).first()
        if last is not None:
            desired.add_metric([sku], last.desired)
            decision.add_metric([sku, policy.mode, last.reason[:200]], last.created_at.timestamp())
    yield from (current, desired, pending, decision)


def telemetry_metrics() -> Iterator[Metric]:
    """Per GPU of each running job, as last sampled (apps/telemetry): gone when the job ends."""
    util = GaugeMetricFamily("gpuplatform_job_gpu_utilization", "GPU utilisation of a running job, 0..100",
                             labels=["tenant", "job", "node", "gpu"])  # fmt: skip
    memory = GaugeMetricFamily("gpuplatform_job_gpu_memory_bytes", "GPU memory a running job uses",
                               labels=["tenant", "job", "node", "gpu"])  # fmt: skip
    for tenant, job, node, index, percent, used in running_gauges():
        util.add_metric([tenant, job, node, str(index)], percent)
        memory.add_metric([tenant, job, node, str(index)], used)
    yield from (util, memory)


class DatabaseCollector:
    def collect(self) -> Iterator[Metric]:
        yield from job_metrics()
        yield from telemetry_metrics()
        yield from fleet_metrics()
        yield from control_metrics()
        yield from autoscale_metrics()


def _scraper_allowed(request) -> bool:
    """Open when GPUPLATFORM_METRICS_TOKEN is unset (as before); else `Authorization: Bearer
    <it>`, compared in constant time so the answer's timing tells nothing about the token."""
    expected = settings.METRICS_TOKEN
    if not expected:
        return True
    scheme, _, given = request.META.get("HTTP_AUTHORIZATION", "").partition(" ")
    if scheme.lower() != "bearer":
        return False
    return hmac.compare_digest(given.strip().encode(), expected.encode())


def metrics(request):
    if not _scraper_allowed(request):
        response = HttpResponse(
            "a bearer token is required\n", status=401, content_type="text/plain"
        )
        response["WWW-Authenticate"] = 'Bearer realm="metrics"'
        return response
    registry = CollectorRegistry(auto_describe=False)
    registry.register(DatabaseCollector())
    return HttpResponse(generate_latest(registry), content_type=CONTENT_TYPE_LATEST)
