"""Webhooks: a local receiver gets one correctly signed delivery per job state change, in order,
once each; deliveries retry with backoff and survive the receiver being down for a while."""

import hashlib
import hmac
import http.server
import json
import socket
import threading
from datetime import timedelta

import pytest
from django.test import Client
from django.utils import timezone

from apps.jobs.models import Job, JobState
from apps.jobs.services import transition_job
from apps.tenants.models import Tenant
from apps.webhooks import services
from apps.webhooks.models import DeliveryState, WebhookDelivery


@pytest.fixture(autouse=True)
def allow_loopback(settings):
    """These tests' receivers are on loopback: allow-listed, as an operator of a self-hosted
    receiver would (the guard itself: tests/webhooks)."""
    settings.WEBHOOK_ALLOW_NETWORKS = "127.0.0.0/8"


GOOD = {"template": "demo-train", "params": {"steps": 3}, "gpus": 1, "gpu_sku": "H100-80GB"}


class Receiver:
    """A local HTTP server that records what it is sent and answers `status`."""

    def __init__(self, port: int):
        self.port, self.status, self.received = port, 200, []
        receiver = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self):
                body = self.rfile.read(int(self.headers["Content-Length"]))
                receiver.received.append((dict(self.headers), body, receiver.status))
                self.send_response(receiver.status)
                self.end_headers()

            def log_message(self, *args):
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", port), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def stop(self):
        self.server.shutdown()
        self.server.server_close()


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture
def run_job(as_user):
    def run() -> Job:
        job = Job.objects.get(
            pk=as_user("bob").post("/api/v1/jobs/", GOOD, format="json").json()["id"]
        )
        for to in (JobState.STARTING, JobState.RUNNING, JobState.SUCCEEDED):
            assert transition_job(job, to=to, expect=[job.state], actor="test")
        return job

    return run


def verify(secret: str, headers: dict, body: bytes) -> bool:
    expected = hmac.new(
        secret.encode(), headers["X-Gpuplatform-Timestamp"].encode() + b"." + body, hashlib.sha256
    )
    return hmac.compare_digest(headers["X-Gpuplatform-Signature"], "sha256=" + expected.hexdigest())


def test_each_state_change_reaches_the_receiver_signed_in_order_despite_an_outage(cast, run_job):
    port = free_port()
    acme = Tenant.objects.get(slug="acme")
    hook = services.webhook_create(tenant=acme, url=f"http://127.0.0.1:{port}/hook")
    outsider = services.webhook_create(
        tenant=Tenant.objects.get(slug="globex"), url=f"http://127.0.0.1:{port}/x"
    )
    job = run_job()
    t0 = timezone.now() + timedelta(seconds=services.SETTLE_SECONDS + 1)

    # Down (nothing listening): the first delivery fails and waits its backoff; the later ones
    # wait behind it, so the receiver will see the states in order.
    assert services.pump(now=t0) == 0
    pending = WebhookDelivery.objects.filter(webhook=hook).order_by("event_id")
    assert pending.count() == 4 and all(d.state == "pending" for d in pending)
    assert [d.attempts for d in pending] == [1, 0, 0, 0]
    assert "refused" in pending.first().last_error.lower()
    assert services.pump(now=t0 + timedelta(seconds=0.5)) == 0  # not due yet
    assert [d.attempts for d in pending.all()] == [1, 0, 0, 0]

    receiver = Receiver(port)
    try:
        receiver.status = 503  # up but failing
        assert services.pump(now=t0 + timedelta(seconds=1.5)) == 0
        assert [(d.attempts, d.last_status_code) for d in pending.all()] == [
            (2, 503),
            (0, None),
            (0, None),
            (0, None),
        ]

        receiver.status = 200
        assert services.pump(now=t0 + timedelta(seconds=10)) == 4
        assert services.pump(now=t0 + timedelta(seconds=60)) == 0  # once each
    finally:
        receiver.stop()

    delivered = [(h, b) for h, b, status in receiver.received if status == 200]
    bodies = [json.loads(b) for _, b in delivered]
    assert [b["to"] for b in bodies] == ["queued", "starting", "running", "succeeded"]
    assert {b["job"]["id"] for b in bodies} == {str(job.pk)}
    assert all(verify(hook.secret, h, b) for h, b in delivered)
    assert not verify(outsider.secret, *delivered[0])
    assert all(d.state == DeliveryState.DELIVERED for d in pending.all())
    assert [d.attempts for d in pending.all()] == [3, 1, 1, 1]
    assert not WebhookDelivery.objects.filter(webhook=outsider).exists()


def test_a_new_webhook_does_not_replay_history_and_a_dead_receiver_is_given_up(cast, run_job):
    run_job()
    hook = services.webhook_create(
        tenant=Tenant.objects.get(slug="acme"), url=f"http://127.0.0.1:{free_port()}/"
    )
    later = timezone.now() + timedelta(seconds=services.SETTLE_SECONDS + 1)
    assert services.deliveries_enqueue(now=later) == 0
    job = Job.objects.get()
    Job.objects.filter(pk=job.pk).update(
        state=JobState.SUCCEEDED
    )  # (history only; a new event below)
    from apps.jobs.services import record_event

    record_event(
        job, actor="test", from_state="succeeded", to_state="queued", reason="requeued by support"
    )
    now = timezone.now() + timedelta(seconds=services.SETTLE_SECONDS + 1)
    for _ in range(services.MAX_ATTEMPTS):
        services.pump(now=now)
        now += timedelta(seconds=services.MAX_BACKOFF_SECONDS)
    [delivery] = WebhookDelivery.objects.filter(webhook=hook)
    assert delivery.state == DeliveryState.FAILED and delivery.attempts == services.MAX_ATTEMPTS


def test_backoff_doubles_up_to_ten_minutes():
    assert [services.backoff(n).total_seconds() for n in (1, 2, 3, 4, 10, 11, 30)] == [
        1,
        2,
        4,
        8,
        512,
        600,
        600,
    ]


def test_the_usage_page_shows_the_tenants_delivery_log(cast, run_job):
    hook = services.webhook_create(
        tenant=Tenant.objects.get(slug="acme"), url="http://127.0.0.1:9/hook"
    )
    run_job()
    services.deliveries_enqueue(now=timezone.now() + timedelta(seconds=services.SETTLE_SECONDS + 1))
    client = Client()
    client.force_login(cast["bob"][0])
    page = client.get("/usage/").content.decode()
    assert hook.url in page and "pending" in page
    client.force_login(cast["dave"][0])
    assert hook.url not in client.get("/usage/").content.decode()
