"""Idempotency-Key: a retried submit never creates a second job."""

import concurrent.futures
from datetime import timedelta

import pytest
import requests
from django.utils import timezone

from apps.admission.models import IdempotencyKey
from apps.jobs.models import Job
from apps.tenants.models import Tenant
from apps.tenants.services import quota_set
from tests.admission.conftest import TRAIN
from tests.factories import make_cast, make_node


def submit(client, body, key):
    return client.post("/api/v1/jobs/", body, format="json", HTTP_IDEMPOTENCY_KEY=key)


def test_a_replay_returns_the_same_job_with_200(as_user):
    first = submit(as_user("bob"), TRAIN, "order-1")
    again = submit(
        as_user("bob"),
        {"gpus": 1, "params": {"steps": 2}, "gpu_sku": "H100-80GB", "template": "demo-train"},
        "order-1",
    )  # fmt: skip (same body, other key order)
    assert (first.status_code, again.status_code) == (201, 200)
    assert again.json()["id"] == first.json()["id"]
    assert Job.objects.count() == 1


def test_the_same_key_with_another_body_is_a_conflict(as_user):
    submit(as_user("bob"), TRAIN, "order-1")
    other = submit(as_user("bob"), {**TRAIN, "gpus": 2}, "order-1")
    assert other.status_code == 409
    assert "different request body" in other.json()["Idempotency-Key"][0]
    assert Job.objects.count() == 1


def test_keys_belong_to_a_tenant(as_user):
    mine = submit(as_user("bob"), TRAIN, "order-1").json()
    theirs = submit(as_user("dave"), TRAIN, "order-1")
    assert theirs.status_code == 201 and theirs.json()["id"] != mine["id"]
    # ...and a colleague in the same tenant replays the same job.
    assert submit(as_user("alice"), TRAIN, "order-1").json()["id"] == mine["id"]


def test_a_key_older_than_24_hours_is_forgotten(as_user):
    first = submit(as_user("bob"), TRAIN, "order-1").json()
    IdempotencyKey.objects.update(created_at=timezone.now() - timedelta(hours=24, seconds=1))
    again = submit(as_user("bob"), {**TRAIN, "gpus": 2}, "order-1")
    assert again.status_code == 201 and again.json()["id"] != first["id"]


def test_an_empty_or_huge_key_is_refused(as_user):
    assert submit(as_user("bob"), TRAIN, " ").status_code == 400
    assert submit(as_user("bob"), TRAIN, "k" * 256).status_code == 400


@pytest.mark.django_db(transaction=True)
def test_concurrent_replays_create_exactly_one_job(live_server, settings):
    people = make_cast()
    make_node("h1", "H100-80GB", 8)
    quota_set(
        tenant=Tenant.objects.get(slug="acme"), submit_rate_per_minute=100_000, submit_burst=100_000
    )
    headers = {"Authorization": f"Token {people['bob'][1]}", "Idempotency-Key": "retry-storm"}

    def submit_once(_):
        response = requests.post(
            f"{live_server.url}/api/v1/jobs/", json=TRAIN, headers=headers, timeout=120
        )
        return response.status_code, response.json()["id"]

    with concurrent.futures.ThreadPoolExecutor(20) as pool:
        answers = list(pool.map(submit_once, range(20)))

    assert sorted(code for code, _ in answers) == [200] * 19 + [201]
    assert len({job_id for _, job_id in answers}) == 1
    assert Job.objects.count() == 1
