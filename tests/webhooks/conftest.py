"""Fixtures of the webhook tests: the cast and clients of tests/web, loopback receivers that
count hits, the sender's connections, one job's state changes."""

from datetime import timedelta

import pytest
from django.utils import timezone

from apps.jobs.models import Job, JobState
from apps.jobs.services import transition_job
from apps.tenants.models import Tenant
from apps.webhooks import sender, services
from apps.webhooks.models import Webhook
from tests.web import conftest as web
from tests.webhooks.receivers import Counter

# The same cast, clients and fresh rate-limit buckets as tests/web.
cast, as_user, browser_as, fresh_buckets = web.cast, web.as_user, web.browser_as, web.fresh_buckets

GOOD = {"template": "demo-train", "params": {"steps": 3}, "gpus": 1, "gpu_sku": "H100-80GB"}


@pytest.fixture
def receiver():
    counters = []

    def make(**kwargs) -> Counter:
        counters.append(Counter(**kwargs))
        return counters[-1]

    yield make
    for counter in counters:
        counter.stop()


@pytest.fixture
def guard_on(settings):
    settings.WEBHOOK_ALLOW_NETWORKS = ()


@pytest.fixture
def connections(monkeypatch):
    """Every TCP connection the sender opens, by address; the real one only to loopback."""
    opened = []
    real = sender.socket.create_connection

    def create_connection(address, *args, **kwargs):
        opened.append(address[0])
        assert address[0] in ("127.0.0.1", "::1"), f"the sender tried to connect to {address[0]}"
        return real(address, *args, **kwargs)

    monkeypatch.setattr(sender.socket, "create_connection", create_connection)
    return opened


@pytest.fixture
def state_change(as_user):
    """One job that went through queued -> starting: two state events to deliver."""

    def run() -> Job:
        job = Job.objects.get(
            pk=as_user("bob").post("/api/v1/jobs/", GOOD, format="json").json()["id"]
        )
        assert transition_job(job, to=JobState.STARTING, expect=[job.state], actor="test")
        return job

    return run


def later(seconds: float = 0) -> timezone.datetime:
    return timezone.now() + timedelta(seconds=services.SETTLE_SECONDS + 1 + seconds)


def hook_row(url: str) -> Webhook:
    """A webhook made before the guard, or whose name resolved elsewhere when it was made: the
    send-time check is what stands between it and the address."""
    return Webhook.objects.create(tenant=Tenant.objects.get(slug="acme"), url=url, cursor=0)
