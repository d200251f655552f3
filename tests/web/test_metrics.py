"""`/metrics` parses with the Prometheus client's parser and moves as jobs run."""

from datetime import timedelta

from django.test import Client
from django.utils import timezone
from prometheus_client.parser import text_string_to_metric_families

from apps.jobs.models import GpuAllocation, Job, JobAttempt, JobState
from apps.nodes.models import Gpu, Node
from gpuplatform.metrics import record_admission_rejection, record_dispatch_pass

GOOD = {"template": "demo-train", "params": {"steps": 3}, "gpus": 2, "gpu_sku": "H100-80GB"}


def scrape() -> dict[tuple[str, tuple], float]:
    response = Client().get("/metrics")
    assert response.status_code == 200 and response["Content-Type"].startswith("text/plain")
    samples = {}
    for family in text_string_to_metric_families(response.content.decode()):
        for sample in family.samples:
            samples[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return samples


def value(samples, name, **labels):
    return samples.get((name, tuple(sorted(labels.items()))), 0)


def test_metrics_parse_and_move_as_a_job_is_queued_placed_and_started(as_user):
    from apps.scheduling.figures import DISPATCH_KEY
    from apps.scheduling.redis import client

    client().hdel(DISPATCH_KEY, "fragmentation")  # another test's dispatcher measured one
    before = scrape()
    assert value(before, "gpuplatform_gpus_total", sku="H100-80GB") == 8
    assert value(before, "gpuplatform_nodes", state="ready") == 2
    assert value(before, "gpuplatform_job_wait_seconds_count", tier="enterprise") == 0

    job_id = as_user("bob").post("/api/v1/jobs/", GOOD, format="json").json()["id"]
    queued = scrape()
    assert value(queued, "gpuplatform_queue_depth", tier="enterprise", sku="H100-80GB") == 1
    assert value(queued, "gpuplatform_jobs", state="queued") == 1

    job = Job.objects.get(pk=job_id)
    Job.objects.filter(pk=job_id).update(
        state=JobState.RUNNING, started_at=job.created_at + timedelta(seconds=20)
    )
    attempt = JobAttempt.objects.create(job=job, number=1, state="running")
    for gpu in Gpu.objects.filter(node__name="h1")[:2]:
        GpuAllocation.objects.create(attempt=attempt, gpu=gpu)
    running = scrape()
    assert value(running, "gpuplatform_jobs", state="running") == 1
    assert value(running, "gpuplatform_queue_depth", tier="enterprise", sku="H100-80GB") == 0
    assert value(running, "gpuplatform_gpus_allocated", sku="H100-80GB") == 2
    assert value(running, "gpuplatform_job_wait_seconds_count", tier="enterprise") == 1
    assert value(running, "gpuplatform_job_wait_seconds_bucket", tier="enterprise", le="15.0") == 0
    assert value(running, "gpuplatform_job_wait_seconds_bucket", tier="enterprise", le="30.0") == 1
    assert 19 <= value(running, "gpuplatform_job_wait_seconds_sum", tier="enterprise") <= 21
    assert ("gpuplatform_gpu_fragmentation", ()) not in running  # no dispatcher has measured it


def test_fragmentation_is_the_dispatchers_measure_and_a_scrape_never_reads_the_cluster(
    cast, monkeypatch
):
    """The dispatcher measures its kept cluster after a pass (at most every
    FRAGMENTATION_EVERY_S) and leaves the figure in Redis; a scrape reads that, not the cluster
    (a full read per scrape cost 0.7-1.0 s of CPU at 1,000 nodes x 8 GPUs)."""
    from apps.scheduling import kept, tasks

    kept.KEPT.forget()
    monkeypatch.setitem(tasks._measured, "at", float("-inf"))
    measured = []
    real = kept.Kept.fragmentation
    monkeypatch.setattr(kept.Kept, "fragmentation", lambda self: measured.append(1) or real(self))
    tasks._timed_pass()  # the first pass: measured
    tasks._timed_pass()  # within FRAGMENTATION_EVERY_S: not again
    assert len(measured) == 1

    def no_reads(*args, **kwargs):
        raise AssertionError("a scrape read the cluster")

    monkeypatch.setattr(kept.State, "load", no_reads)
    record_dispatch_pass(0.1, fragmentation=0.25)
    assert value(scrape(), "gpuplatform_gpu_fragmentation") == 0.25


def test_heartbeat_age_dispatch_duration_and_rejections_are_exported(cast):
    Node.objects.filter(name="h1").update(last_heartbeat_at=timezone.now() - timedelta(seconds=30))
    before = scrape()
    record_dispatch_pass(0.125)
    record_admission_rejection("rate_limited")
    after = scrape()
    assert 29 <= value(after, "gpuplatform_node_heartbeat_age_seconds", node="h1") < 60
    assert value(after, "gpuplatform_dispatch_last_seconds") == 0.125
    assert (
        value(after, "gpuplatform_dispatch_passes_total")
        == value(before, "gpuplatform_dispatch_passes_total") + 1
    )
    rejected = value(after, "gpuplatform_admission_rejections_total", reason="rate_limited")
    assert (
        rejected
        == value(before, "gpuplatform_admission_rejections_total", reason="rate_limited") + 1
    )


def test_admissions_own_counters_are_exported(cast):
    from apps.admission.counters import bump

    bump("rate_limit_redis_down_refused:free", 2)
    samples = scrape()
    assert (
        value(
            samples,
            "gpuplatform_admission_events_total",
            event="rate_limit_redis_down_refused",
            tier="free",
        )
        == 2
    )
