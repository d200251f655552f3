"""Submit rate limits: token buckets in Redis per tenant and per user, spent from each process's
lease of them (apps/admission/leases.py)."""

import time

import pytest

from apps.admission import leases
from apps.admission.models import AdmissionCounter
from apps.jobs.models import Job, JobState
from apps.tenants.models import Tenant, Tier
from apps.tenants.services import quota_set, tenant_create, user_create
from tests.admission.conftest import TRAIN
from tests.factories import client_for


def limit(slug: str, *, rate: int, burst: int) -> None:
    quota_set(tenant=Tenant.objects.get(slug=slug), submit_rate_per_minute=rate, submit_burst=burst)


def test_every_submit_answer_carries_the_rate_limit_headers(as_user, settings):
    settings.USER_SUBMIT_SHARE = 1
    limit("acme", rate=60, burst=5)
    created = as_user("bob").post("/api/v1/jobs/", TRAIN, format="json")
    refused = as_user("bob").post("/api/v1/jobs/", {**TRAIN, "gpus": "2"}, format="json")

    assert created.status_code == 201 and refused.status_code == 400
    assert (created["X-RateLimit-Limit"], created["X-RateLimit-Remaining"]) == ("5", "4")
    assert refused["X-RateLimit-Remaining"] == "3"
    assert 1 <= int(refused["X-RateLimit-Reset"]) <= 3  # two tokens to refill at one a second


def test_over_the_burst_it_answers_429_and_waiting_retry_after_is_enough(as_user, settings):
    settings.USER_SUBMIT_SHARE = 1
    limit("acme", rate=30, burst=2)  # one token every 2 s
    bob = as_user("bob")
    assert [bob.post("/api/v1/jobs/", TRAIN, format="json").status_code for _ in range(2)] == [
        201,
        201,
    ]

    refused = bob.post("/api/v1/jobs/", TRAIN, format="json")
    assert refused.status_code == 429
    assert refused["Retry-After"] == "2"
    assert refused["X-RateLimit-Remaining"] == "0"
    assert "rate limit" in refused.json()["rate_limit"][0]

    time.sleep(int(refused["Retry-After"]))
    assert bob.post("/api/v1/jobs/", TRAIN, format="json").status_code == 201
    assert Job.objects.filter(tenant__slug="acme").count() == 3


def test_a_user_gets_only_a_share_of_the_tenants_rate(as_user, settings):
    settings.USER_SUBMIT_SHARE = 0.5
    limit("acme", rate=60, burst=4)
    codes = [
        as_user("bob").post("/api/v1/jobs/", TRAIN, format="json").status_code for _ in range(3)
    ]
    assert codes == [201, 201, 429]  # bob's own bucket: burst 2
    assert as_user("alice").post("/api/v1/jobs/", TRAIN, format="json").status_code == 201


def test_a_noisy_tenant_is_refused_while_a_quiet_one_of_the_same_tier_is_never(cast, settings):
    settings.USER_SUBMIT_SHARE = 1
    tenant_create(slug="initech", tier_name="pro")
    _, noisy = user_create(username="nora", tenant_slug="initech")
    limit("initech", rate=120, burst=4)  # 2/s
    limit("globex", rate=120, burst=4)
    loud, quiet = client_for(noisy), client_for(cast["dave"][1])
    codes = {"loud": [], "quiet": []}
    started = time.monotonic()
    for tick in range(40):  # 4 s: the loud tenant at 10/s (5x its rate), the quiet one at 1/s
        codes["loud"].append(
            loud.post("/api/v1/jobs/", {**TRAIN, "tier": "pro"}, format="json").status_code
        )
        if tick % 10 == 0:
            codes["quiet"].append(
                quiet.post("/api/v1/jobs/", {**TRAIN, "tier": "pro"}, format="json").status_code
            )
        time.sleep(max(0.0, started + (tick + 1) * 0.1 - time.monotonic()))

    assert set(codes["quiet"]) == {201}
    assert codes["loud"].count(429) >= 20
    assert codes["loud"].count(201) <= 4 + 2 * 5  # its burst plus what 2/s refills in ~4-5 s


@pytest.fixture
def private_redis(tmp_path, monkeypatch):
    """A Redis of the test's own that it can stop and start again on the same port."""
    import redis

    from apps.admission import buckets
    from gpuplatform import embedded_redis

    server = embedded_redis.start(tmp_path / "redis", persist=False)
    conn = redis.Redis.from_url(server.url, socket_timeout=0.5, socket_connect_timeout=0.5)
    monkeypatch.setattr(buckets, "client", lambda: conn)
    holder = {"server": server}

    def restart():
        holder["server"] = embedded_redis.start(tmp_path / "redis", port=server.port, persist=False)

    yield holder["server"], restart
    holder["server"].stop()


def test_with_redis_stopped_open_tiers_are_admitted_and_closed_ones_get_503_then_all_is_normal_again(
    as_user, cast, private_redis, settings
):
    settings.RATE_LIMIT_FAIL_OPEN_TIERS = ["enterprise", "pro"]
    Tenant.objects.filter(slug="globex").update(tier=Tier.objects.get(name="free"))
    server, restart = private_redis
    assert as_user("bob").post("/api/v1/jobs/", TRAIN, format="json").status_code == 201

    server.stop()
    from_lease = as_user("bob").post("/api/v1/jobs/", TRAIN, format="json")
    assert from_lease.status_code == 201 and "X-RateLimit-Degraded" not in from_lease
    time.sleep(leases.lease_seconds())  # this process's lease of acme's tokens has run out
    admitted = as_user("bob").post(
        "/api/v1/jobs/", TRAIN, format="json"
    )  # acme: enterprise, fails open
    refused = as_user("dave").post(
        "/api/v1/jobs/", {**TRAIN, "tier": "free"}, format="json"
    )  # globex: free

    assert admitted.status_code == 201
    assert admitted["X-RateLimit-Degraded"]
    assert refused.status_code == 503 and refused["Retry-After"] == "5"
    assert "rate limiter is unavailable" in refused.json()["rate_limit"][0]
    assert AdmissionCounter.objects.get(name="rate_limit_redis_down_admitted:enterprise").value == 1
    assert AdmissionCounter.objects.get(name="rate_limit_redis_down_refused:free").value == 1

    restart()
    again = as_user("dave").post("/api/v1/jobs/", {**TRAIN, "tier": "free"}, format="json")
    assert again.status_code == 201 and "X-RateLimit-Remaining" in again
    assert as_user("bob").post("/api/v1/jobs/", TRAIN, format="json").status_code == 201
    # Nothing admitted during the outage was lost: every job is there, queued for the dispatcher.
    assert Job.objects.filter(tenant__slug="acme", state=JobState.QUEUED).count() == 4
    assert Job.objects.filter(tenant__slug="globex").count() == 1
