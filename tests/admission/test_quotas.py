"""Quotas held in the database: queued jobs (429), GPUs per SKU at once (wait), GPU-hours (403)."""

import concurrent.futures
from datetime import UTC, datetime, timedelta

import pytest
import requests

from apps.admission.quotas import period_bounds
from apps.jobs.models import GpuAllocation, Job, JobState
from apps.tenants.models import Tenant
from apps.tenants.services import quota_set
from tests.admission.conftest import TRAIN, placed_ids, run_to_end
from tests.factories import make_cast, make_node, park_node


@pytest.fixture(autouse=True)
def never_fits_is_parked(request):
    """The 64-GPU jobs here stay queued on a cordoned 64-GPU node (tests.factories.park_node):
    a job no node could ever fit is refused at submit (issue 30)."""
    if {"cast", "as_user"} & set(request.fixturenames):
        request.getfixturevalue("cast")
        park_node()


@pytest.mark.django_db(transaction=True)
def test_two_hundred_concurrent_submissions_against_a_cap_of_50_admit_exactly_50(
    live_server, settings
):
    settings.USER_SUBMIT_SHARE = 1
    people = make_cast()
    make_node("h1", "H100-80GB", 8)
    park_node()
    quota_set(tenant=Tenant.objects.get(slug="acme"), max_queued_jobs=50, submit_rate_per_minute=100_000,
              submit_burst=100_000)  # fmt: skip
    headers = {"Authorization": f"Token {people['bob'][1]}"}
    body = {**TRAIN, "gpus": 64}  # never fits: every admitted job stays queued

    def submit(_):
        response = requests.post(
            f"{live_server.url}/api/v1/jobs/", json=body, headers=headers, timeout=120
        )
        return response.status_code, response.headers.get("Retry-After")

    with concurrent.futures.ThreadPoolExecutor(40) as pool:
        answers = list(pool.map(submit, range(200)))

    codes = [code for code, _ in answers]
    assert (codes.count(201), codes.count(429)) == (50, 150), sorted(set(codes))
    assert all(retry and int(retry) > 0 for code, retry in answers if code == 429)
    assert Job.objects.filter(tenant__slug="acme", state=JobState.QUEUED).count() == 50


def test_sixteen_jobs_against_a_six_gpu_cap_never_hold_more_than_six(as_user, tmp_path):
    quota_set(tenant=Tenant.objects.get(slug="acme"), max_gpus={"H100-80GB": 6})
    ids = [
        as_user("bob").post("/api/v1/jobs/", TRAIN, format="json").json()["id"] for _ in range(16)
    ]
    most, finished = 0, 0
    while finished < 16:
        placed = placed_ids()
        held = GpuAllocation.objects.filter(
            released_at=None, attempt__job__tenant__slug="acme"
        ).count()
        most = max(most, held)
        assert held <= 6
        if held == 6 and Job.objects.filter(pk__in=ids, state=JobState.QUEUED).exists():
            assert placed_ids() == set()  # the next pass starts nothing and says why
            reasons = set(
                Job.objects.filter(pk__in=ids, state=JobState.QUEUED).values_list(
                    "reason", flat=True
                )
            )
            assert reasons == {"waiting: tenant acme: 6 of 6 H100-80GB GPUs in use"}
        for job_id in list(placed)[:4]:  # some finish, the rest keep running into the next pass
            run_to_end(job_id, tmp=tmp_path)
            finished += 1
        if not placed:
            for job in Job.objects.filter(pk__in=ids, state=JobState.STARTING)[:4]:
                run_to_end(job.pk, tmp=tmp_path)
                finished += 1
    assert most == 6
    assert Job.objects.filter(pk__in=ids, state=JobState.SUCCEEDED).count() == 16


def test_jobs_placed_in_one_pass_count_together_against_the_cap(as_user):
    quota_set(tenant=Tenant.objects.get(slug="acme"), max_gpus={"H100-80GB": 6})
    for _ in range(4):
        as_user("bob").post("/api/v1/jobs/", {**TRAIN, "gpus": 2}, format="json")
    assert len(placed_ids()) == 3
    waiting = Job.objects.get(tenant__slug="acme", state=JobState.QUEUED)
    assert waiting.reason == "waiting: tenant acme: 6 of 6 H100-80GB GPUs in use"


def test_a_job_naming_no_sku_counts_where_it_lands(as_user):
    quota_set(tenant=Tenant.objects.get(slug="acme"), max_gpus={"H100-80GB": 2})
    as_user("bob").post("/api/v1/jobs/", {**TRAIN, "gpus": 2}, format="json")
    anywhere = (
        as_user("bob").post("/api/v1/jobs/", {**TRAIN, "gpu_sku": None}, format="json").json()
    )
    assert len(placed_ids()) == 1
    assert (
        Job.objects.get(pk=anywhere["id"]).reason
        == "waiting: tenant acme: 2 of 2 H100-80GB GPUs in use"
    )


def test_another_tenant_is_not_held_by_acmes_cap(as_user):
    quota_set(tenant=Tenant.objects.get(slug="acme"), max_gpus={"H100-80GB": 1})
    as_user("bob").post("/api/v1/jobs/", TRAIN, format="json")
    as_user("bob").post("/api/v1/jobs/", TRAIN, format="json")
    as_user("dave").post("/api/v1/jobs/", TRAIN, format="json")
    placed = Job.objects.filter(pk__in=placed_ids())
    assert sorted(job.tenant.slug for job in placed) == ["acme", "globex"]


def test_over_its_gpu_hours_a_tenant_gets_403_with_its_usage_and_when_it_resets(as_user):
    first = as_user("bob").post("/api/v1/jobs/", {**TRAIN, "gpus": 4}, format="json").json()
    placed_ids()
    now = datetime.now(UTC)
    start, end = period_bounds(now)
    GpuAllocation.objects.filter(attempt__job_id=first["id"]).update(
        allocated_at=max(start, now - timedelta(hours=1))
    )
    quota_set(tenant=Tenant.objects.get(slug="acme"), gpu_hours_per_period=3)

    refused = as_user("bob").post("/api/v1/jobs/", TRAIN, format="json")
    assert refused.status_code == 403
    message = refused.json()["gpu_hours"][0]
    assert "of its 3 GPU-hours this period (calendar month, UTC)" in message
    assert f"resets at {end.isoformat()}" in message
    assert (
        as_user("bob").post("/api/v1/jobs/", {**TRAIN, "gpus": 0}, format="json").status_code == 201
    )

    usage = as_user("bob").get("/api/v1/usage/").json()
    assert usage["gpu_hours"]["limit"] == 3 and usage["gpu_hours"]["used"] >= 3.9
    assert usage["gpu_hours"]["resets_at"] == end.isoformat()


def test_the_period_is_the_calendar_month_in_utc():
    assert period_bounds(datetime(2025, 12, 31, 23, 59, tzinfo=UTC)) == (
        datetime(2025, 12, 1, tzinfo=UTC), datetime(2026, 1, 1, tzinfo=UTC))  # fmt: skip
    assert period_bounds(datetime(2026, 2, 14, 8, tzinfo=UTC))[1] == datetime(
        2026, 3, 1, tzinfo=UTC
    )


def test_usage_shows_quotas_use_and_bucket_state(as_user, settings):
    settings.USER_SUBMIT_SHARE = 0.5
    quota_set(tenant=Tenant.objects.get(slug="acme"), max_gpus={"H100-80GB": 6}, submit_rate_per_minute=6,
              submit_burst=10)  # fmt: skip
    as_user("bob").post("/api/v1/jobs/", {**TRAIN, "gpus": 2}, format="json")
    placed_ids()
    usage = as_user("bob").get("/api/v1/usage/").json()
    assert usage["gpu_caps"] == {"H100-80GB": {"cap": 6, "in_use": 2}}
    assert usage["rate_limits"]["available"] is True
    assert usage["rate_limits"]["tenant"]["remaining"] == 9
    assert usage["rate_limits"]["user"]["burst"] == 5  # USER_SUBMIT_SHARE 0.5
    assert usage["limits"]["max_gpus"] == {"H100-80GB": 6}
