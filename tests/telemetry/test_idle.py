"""The idle-GPU policy (apps/telemetry/idle.py): after the tier's warn time with every GPU of a
job idle, one `gpu.idle` event per idle stretch (event stream and webhook); at the action time
the job is cancelled or requeued from its checkpoint, its reason naming the idle minutes and
the limit; `max_preemptions` idle requeues, then a cancel. Minutes are shortened here with
GPUPLATFORM_GPU_IDLE_MINUTE_SECONDS (10 s)."""

import io
import json
import time
from datetime import timedelta

import pytest
from django.core.management import call_command
from django.test import override_settings
from django.utils import timezone

from apps.jobs import services
from apps.jobs.event_hub import Cursor, state_events
from apps.jobs.models import Job, JobEvent
from apps.tenants.models import Tenant, Tier
from apps.webhooks import services as webhooks
from apps.webhooks.models import WebhookDelivery
from apps.webhooks.services import payload_for
from tests.factories import client_for, make_node
from tests.telemetry.test_charts import page
from tests.telemetry.test_storage import heartbeat, running, sample
from tests.unit.test_dispatcher import dispatch_once

pytestmark = pytest.mark.usefixtures("short_minutes")


@pytest.fixture
def short_minutes():
    with override_settings(GPU_IDLE_MINUTE_SECONDS=10):
        yield


def set_tier(*args: str) -> dict:
    out = io.StringIO()
    call_command("set_tier", *args, stdout=out)
    return json.loads(out.getvalue())


def feed(attempt, utils: list[float], *, start: float, node: str = "h1", **extra) -> float:
    """One sample a second per GPU of the attempt's member on `node`; the time after the last."""
    member = attempt.members.get(node__name=node)
    for k, util in enumerate(utils):
        heartbeat(node, [sample(attempt, i, start + k, util, rank=member.rank, **extra)
                         for i in member.gpu_indices])  # fmt: skip
    return start + len(utils)


def idle_events(job) -> list[JobEvent]:
    return list(JobEvent.objects.filter(job=job, kind="gpu.idle").order_by("pk"))


def test_set_tier_changes_the_idle_settings_and_prints_the_tier(cast):
    tier = set_tier("enterprise", "--gpu-idle-warn-minutes", "1", "--gpu-idle-minutes", "2",
                    "--gpu-idle-action", "cancel", "--min-runtime-seconds", "30",
                    "--interactive-idle-minutes", "15")  # fmt: skip
    assert tier["name"] == "enterprise" and tier["gpu_idle_warn_minutes"] == 1
    assert (tier["gpu_idle_minutes"], tier["gpu_idle_action"]) == (2, "cancel")
    assert (tier["min_runtime_seconds"], tier["interactive_idle_minutes"]) == (30, 15)
    assert set_tier("enterprise", "--gpu-idle-minutes", "off")["gpu_idle_minutes"] is None
    assert set_tier("enterprise")["gpu_idle_warn_minutes"] == 1  # unchanged when not given


def test_the_default_tiers_idle_policy(cast):
    tiers = {t.name: t for t in Tier.objects.all()}
    assert (tiers["free"].gpu_idle_warn_minutes, tiers["free"].gpu_idle_minutes) == (60, 120)
    assert tiers["free"].gpu_idle_action == "cancel"
    assert (tiers["pro"].gpu_idle_warn_minutes, tiers["pro"].gpu_idle_action) == (120, "none")
    assert tiers["enterprise"].gpu_idle_warn_minutes is None
    assert tiers["enterprise"].gpu_idle_action == "none"


def test_an_idle_job_is_warned_once_per_stretch_then_cancelled_naming_minutes_and_limit(
    cast, settings
):
    settings.WEBHOOK_ALLOW_NETWORKS = "127.0.0.0/8"  # its receiver is on loopback (never sent)
    set_tier("enterprise", "--gpu-idle-warn-minutes", "1", "--gpu-idle-minutes", "2",
             "--gpu-idle-action", "cancel", "--min-runtime-seconds", "3600")  # fmt: skip
    make_node("h1", gpus=4)
    hook = webhooks.webhook_create(
        tenant=Tenant.objects.get(slug="acme"), url="http://127.0.0.1:9/"
    )
    job, attempt = running(cast, gpus=2)
    t = feed(attempt, [80] * 5 + [0] * 9, start=time.time() - 60)  # idle 9 s: not yet warned
    assert idle_events(job) == []
    assert 'id="gpu-idle-banner"' not in page(cast, job)
    t = feed(attempt, [0] * 3, start=t)  # 12 s idle: past the warn minute (10 s)
    (warned,) = idle_events(job)
    assert 'id="gpu-idle-banner"' in page(cast, job)  # the job page says so
    assert "every GPU idle for 1.0 minutes" in page(cast, job)
    assert warned.data == {"job": str(job.pk), "idle_minutes": 1.0, "limit_minutes": 2,
                           "action": "cancel"}  # fmt: skip
    t = feed(attempt, [0] * 3 + [50] + [0] * 12, start=t)  # busy a second: a new stretch
    assert len(idle_events(job)) == 2  # once per idle stretch, never every sample
    job.refresh_from_db()
    assert job.state == "running"  # 12 s: warned, not yet the limit (20 s)
    feed(attempt, [0] * 9, start=t)  # 20 s: the limit (the min runtime does not delay it)
    job.refresh_from_db()
    assert job.state == "cancelled"
    assert "GPUs idle for 2.0 minutes" in job.reason and "limit is 2 minutes" in job.reason
    payload = payload_for(idle_events(job)[0])
    assert payload["type"] == "gpu.idle" and payload["job"]["id"] == str(job.pk)
    assert payload["idle_minutes"] == 1.0 and payload["limit_minutes"] == 2
    streamed = [m for m in state_events(job.pk, Cursor()) if m.startswith("id:")]
    idle = [m for m in streamed if "event: gpu.idle" in m]
    assert len(idle) == 2 and '"limit_minutes": 2' in idle[0]
    later = timezone.now() + timedelta(seconds=webhooks.SETTLE_SECONDS + 1)
    webhooks.deliveries_enqueue(now=later)
    sent = [d.payload for d in WebhookDelivery.objects.filter(webhook=hook).order_by("pk")]
    assert [p["type"] for p in sent if p["type"] == "gpu.idle"] == ["gpu.idle", "gpu.idle"]
    logs = client_for(cast["bob"][1]).get(f"/api/v1/jobs/{job.pk}/logs/").content.decode()
    notices = [line for line in logs.splitlines() if line.startswith("[gpuplatform ")]
    assert len(notices) == 2 and "every GPU idle for 1.0 minutes" in notices[0]


def test_a_job_with_one_busy_gpu_is_not_idle(cast):
    set_tier("enterprise", "--gpu-idle-warn-minutes", "1", "--gpu-idle-minutes", "1",
             "--gpu-idle-action", "cancel")  # fmt: skip
    make_node("h1", gpus=4)
    job, attempt = running(cast, gpus=2)
    busy, idle = attempt.members.get().gpu_indices
    start = time.time() - 60
    for k in range(25):
        heartbeat("h1", [sample(attempt, busy, start + k, 90), sample(attempt, idle, start + k, 0)])
    job.refresh_from_db()
    assert job.state == "running" and idle_events(job) == []


def test_idle_requeues_from_the_checkpoint_then_cancels_after_max_preemptions(cast):
    set_tier("enterprise", "--gpu-idle-minutes", "1", "--gpu-idle-action", "requeue")
    Tier.objects.filter(name="enterprise").update(max_preemptions=1)
    make_node("h1", gpus=4)
    job, attempt = running(cast, gpus=1)
    feed(attempt, [0] * 12, start=time.time() - 60)
    job.refresh_from_db()
    assert job.state == "preempting" and "GPUs idle for 1.0 minutes" in job.reason
    attempt.refresh_from_db()
    assert attempt.stop_requested == "preempt"
    assert len(idle_events(job)) == 1  # warned at the action time when no warn time is set
    services.attempt_member_finished(attempt_id=attempt.pk, rank=0, token=str(attempt.token),
                                     exit_code=0, checkpoint="ckpt-1")  # fmt: skip
    attempt.refresh_from_db()
    job.refresh_from_db()
    assert attempt.state == "preempted" and job.state == "queued"
    dispatch_once()
    second = job.attempts.get(number=2)
    services.attempt_member_started(attempt_id=second.pk, rank=0, token=str(second.token), pid=1)
    feed(second, [0] * 12, start=time.time() - 30)
    job = Job.objects.get(pk=job.pk)
    assert job.state == "cancelled"
    assert "already requeued 1 times for idleness" in job.reason
    assert [a.state for a in job.attempts.order_by("number")][0] == "preempted"


def test_a_gang_is_idle_only_when_every_member_on_every_node_is(cast):
    set_tier("enterprise", "--gpu-idle-warn-minutes", "1")
    make_node("h1", gpus=2)
    make_node("h2", gpus=2)
    job, attempt = running(cast, gpus=2, nodes=2)
    start = time.time() - 60
    feed(attempt, [0] * 15, start=start, node="h1")
    assert idle_events(job) == []  # h2 has said nothing yet
    feed(attempt, [0] * 15, start=start, node="h2")
    (event,) = idle_events(job)
    assert event.data["action"] == "none" and event.data["limit_minutes"] == 1


def test_typing_in_a_session_on_any_rank_keeps_an_idle_job_alive(cast):
    set_tier("enterprise", "--gpu-idle-warn-minutes", "1", "--gpu-idle-minutes", "2",
             "--gpu-idle-action", "cancel")  # fmt: skip
    make_node("h1", gpus=2)
    make_node("h2", gpus=2)
    job, attempt = running(cast, gpus=2, nodes=2)
    start = time.time() - 120
    t = feed(attempt, [0] * 25, start=start, node="h1")  # rank 0: idle past the limit (20 s)
    # Rank 1: idle GPUs, but someone types in an exec there (the agent marks its samples).
    feed(attempt, [0] * 25, start=start, node="h2", active=True)
    job.refresh_from_db()
    assert job.state == "running" and idle_events(job) == []
    # The typing stops: idle from there, warned at 10 s and cancelled at 20 s.
    feed(attempt, [0] * 12, start=t, node="h1")
    feed(attempt, [0] * 12, start=t, node="h2")
    (warned,) = idle_events(job)
    assert warned.data["idle_minutes"] == 1.0  # counted from the last keystroke, not the start
    job.refresh_from_db()
    assert job.state == "running"
    feed(attempt, [0] * 10, start=t + 12, node="h1")
    feed(attempt, [0] * 10, start=t + 12, node="h2")
    job.refresh_from_db()
    assert job.state == "cancelled" and "limit is 2 minutes" in job.reason


def test_only_a_true_active_counts(cast):
    set_tier("enterprise", "--gpu-idle-minutes", "1", "--gpu-idle-action", "cancel")
    make_node("h1", gpus=2)
    job, attempt = running(cast, gpus=1)
    feed(attempt, [0] * 12, start=time.time() - 60, active="yes")  # not a boolean: ignored
    job.refresh_from_db()
    assert job.state == "cancelled"
