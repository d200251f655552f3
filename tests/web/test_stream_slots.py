"""The caps on open event streams (apps/jobs/stream_slots.py): per token, per tenant, a slot
given back on close, a dead process's slots counted out when their lease ends; and the view's
429 with Retry-After."""

import pytest
import redis
from django.test import override_settings

from apps.jobs import stream_slots
from apps.jobs.models import Job
from apps.platform.redis import shared_client
from tests.web.test_events import body_of

GOOD = {"template": "demo-train", "params": {"steps": 3}, "gpus": 1, "gpu_sku": "H100-80GB"}


@pytest.fixture(autouse=True)
def no_slots():
    """Slots are keyed by database ids, which a rolled-back test gives out again."""
    conn = shared_client()
    for key in conn.scan_iter(f"{stream_slots.PREFIX}*"):
        conn.delete(key)
    yield
    for key in conn.scan_iter(f"{stream_slots.PREFIX}*"):
        conn.delete(key)


@override_settings(MAX_STREAMS_PER_TOKEN=2, MAX_STREAMS_PER_TENANT=3)
def test_the_token_cap_then_the_tenant_cap_and_a_closed_slot_comes_back():
    first = [stream_slots.acquire(holder="a", tenant_id=1) for _ in range(2)]
    with pytest.raises(stream_slots.OverCap) as over:
        stream_slots.acquire(holder="a", tenant_id=1)
    assert over.value.scope == "token"
    stream_slots.acquire(holder="b", tenant_id=1)
    with pytest.raises(stream_slots.OverCap) as over:
        stream_slots.acquire(holder="c", tenant_id=1)
    assert over.value.scope == "tenant"
    stream_slots.acquire(holder="c", tenant_id=2)  # another tenant is not held back
    stream_slots.release(first[:1])
    assert stream_slots.open_count(stream_slots.tenant_key(1)) == 2
    stream_slots.acquire(holder="a", tenant_id=1)


@override_settings(MAX_STREAMS_PER_TOKEN=1, MAX_STREAMS_PER_TENANT=1)
def test_a_slot_whose_lease_ended_stops_counting_and_a_renewal_does_not_revive_it():
    dead = stream_slots.acquire(holder="a", tenant_id=1)
    with pytest.raises(stream_slots.OverCap):
        stream_slots.acquire(holder="a", tenant_id=1)
    conn = shared_client()
    for key in dead.keys:  # its process died: no renewal came, the lease ran out
        conn.zadd(key, {dead.member: 1.0})
    assert stream_slots.open_count(stream_slots.token_key("a")) == 0
    alive = stream_slots.acquire(holder="a", tenant_id=1)
    stream_slots.renew([dead, alive])
    assert stream_slots.open_count(stream_slots.tenant_key(1)) == 1
    assert conn.zscore(alive.keys[1], dead.member) is None


@pytest.mark.django_db(transaction=True)
@override_settings(MAX_STREAMS_PER_TENANT=1)
def test_over_the_cap_the_view_answers_429_with_retry_after_then_200_once_a_slot_is_free(as_user):
    job_id = as_user("bob").post("/api/v1/jobs/", GOOD, format="json").json()["id"]
    tenant_id = Job.objects.get(pk=job_id).tenant_id
    held = stream_slots.acquire(holder="another-token", tenant_id=tenant_id)
    for accept in ("application/json", "text/event-stream"):
        response = as_user("bob").get(
            f"/api/v1/jobs/{job_id}/events/?timeout=1", HTTP_ACCEPT=accept
        )
        assert response.status_code == 429
        assert response["Retry-After"] == str(stream_slots.RETRY_AFTER_SECONDS)
    stream_slots.release([held])
    response = as_user("bob").get(
        f"/api/v1/jobs/{job_id}/events/?timeout=1", HTTP_ACCEPT="text/event-stream"
    )
    assert response.status_code == 200
    assert "event: state" in body_of(response)


@pytest.mark.django_db(transaction=True)
def test_without_redis_a_stream_is_served_uncounted(as_user, monkeypatch):
    job_id = as_user("bob").post("/api/v1/jobs/", GOOD, format="json").json()["id"]

    def down(**_):
        raise redis.exceptions.ConnectionError("down")

    monkeypatch.setattr(stream_slots, "acquire", down)
    response = as_user("bob").get(
        f"/api/v1/jobs/{job_id}/events/?timeout=1", HTTP_ACCEPT="text/event-stream"
    )
    assert response.status_code == 200
    assert "event: state" in body_of(response)
