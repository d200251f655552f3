"""Results only reach those allowed to see them: outsiders get 404, viewers cannot cancel,
no token gets 401."""

import pytest
from django.core.files.base import ContentFile
from django.core.files.storage import default_storage

from apps.jobs.models import Artifact, Job

GOOD = {"template": "demo-train", "params": {"steps": 3}, "gpus": 1, "gpu_sku": "H100-80GB"}


@pytest.fixture
def bobs_job(as_user):
    job_id = as_user("bob").post("/api/v1/jobs/", GOOD, format="json").json()["id"]
    job = Job.objects.get(pk=job_id)
    job.attempts_count = 1
    job.save(update_fields=["attempts_count"])
    default_storage.save(f"logs/{job_id}/attempt-1.log", ContentFile(b"secret training log\n"))
    Artifact.objects.create(
        job=job,
        name="result.json",
        file=default_storage.save(f"artifacts/{job_id}/result.json", ContentFile(b"{}")),
    )
    return job_id


@pytest.mark.parametrize("suffix", ["", "logs/", "artifacts/", "artifacts/result.json"])
def test_another_tenant_gets_404_on_the_job_and_its_results(as_user, bobs_job, suffix):
    response = as_user("dave").get(f"/api/v1/jobs/{bobs_job}/{suffix}")
    assert response.status_code == 404


@pytest.mark.parametrize("suffix", ["", "logs/", "artifacts/", "artifacts/result.json"])
def test_no_token_gets_401(as_user, bobs_job, suffix):
    assert as_user(None).get(f"/api/v1/jobs/{bobs_job}/{suffix}").status_code == 401


def test_a_bad_token_gets_401(cast):
    from tests.factories import client_for

    assert client_for("not-a-token").get("/api/v1/jobs/").status_code == 401


@pytest.mark.parametrize("suffix", ["", "logs/", "artifacts/", "artifacts/result.json"])
def test_a_viewer_of_the_tenant_reads_everything(as_user, bobs_job, suffix):
    assert as_user("carol").get(f"/api/v1/jobs/{bobs_job}/{suffix}").status_code == 200


def test_the_log_comes_back_as_text(as_user, bobs_job):
    response = as_user("bob").get(f"/api/v1/jobs/{bobs_job}/logs/")
    assert response["Content-Type"].startswith("text/plain")
    assert b"secret training log" in response.content


def test_a_viewer_cannot_cancel(as_user, bobs_job):
    response = as_user("carol").post(f"/api/v1/jobs/{bobs_job}/cancel/")
    assert response.status_code == 403
    assert Job.objects.get(pk=bobs_job).state == "queued"


def test_a_viewer_cannot_submit(as_user):
    assert as_user("carol").post("/api/v1/jobs/", GOOD, format="json").status_code == 403


def test_another_tenant_cannot_cancel_and_learns_nothing(as_user, bobs_job):
    assert as_user("dave").post(f"/api/v1/jobs/{bobs_job}/cancel/").status_code == 404


def test_the_owner_cancels_a_queued_job(as_user, bobs_job):
    response = as_user("bob").post(f"/api/v1/jobs/{bobs_job}/cancel/")
    assert response.status_code == 200
    assert response.json()["state"] == "cancelled"
    assert as_user("bob").post(f"/api/v1/jobs/{bobs_job}/cancel/").status_code == 400


def test_the_tenant_admin_cancels_a_members_job(as_user, bobs_job):
    assert as_user("alice").post(f"/api/v1/jobs/{bobs_job}/cancel/").status_code == 200


def test_lists_show_only_the_callers_tenant(as_user, bobs_job):
    assert [j["id"] for j in as_user("bob").get("/api/v1/jobs/").json()["results"]] == [bobs_job]
    assert as_user("dave").get("/api/v1/jobs/").json()["count"] == 0


def test_the_list_filters_by_state_and_tier(as_user, bobs_job):
    assert as_user("bob").get("/api/v1/jobs/?state=queued&tier=enterprise").json()["count"] == 1
    assert as_user("bob").get("/api/v1/jobs/?state=running").json()["count"] == 0
    assert as_user("bob").get("/api/v1/jobs/?state=bogus").status_code == 400


def test_the_list_takes_a_page_size_and_refuses_a_bad_one_naming_it(as_user, bobs_job):
    second = as_user("bob").post("/api/v1/jobs/", GOOD, format="json").json()["id"]
    page = as_user("bob").get("/api/v1/jobs/?page_size=1").json()
    assert page["count"] == 2 and len(page["results"]) == 1 and page["next"]
    assert {page["results"][0]["id"], bobs_job, second} == {bobs_job, second}
    for bad in ("0", "-3", "1001", "many"):
        answer = as_user("bob").get(f"/api/v1/jobs/?page_size={bad}")
        assert answer.status_code == 400 and "page_size" in answer.json(), bad


def test_nodes_are_for_staff_only(as_user):
    assert as_user("bob").get("/api/v1/nodes/").status_code == 403
    nodes = as_user("staff").get("/api/v1/nodes/").json()
    assert nodes["results"][0]["name"] == "h1"
    assert len(nodes["results"][0]["gpus"]) == 8


def test_usage_shows_the_callers_tenant(as_user, bobs_job):
    usage = as_user("bob").get("/api/v1/usage/").json()
    assert usage["tenant"] == "acme"
    assert usage["usage"]["queued_jobs"] == 1


def test_the_schema_and_health_answer(as_user):
    assert as_user(None).get("/api/schema/").status_code == 200
    health = as_user(None).get("/healthz")
    assert health.status_code == 200, health.content
    assert health.json()["redis"] == "ok"


def test_the_job_list_costs_the_same_queries_for_3_jobs_as_for_23(as_user, cast):
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    def cost() -> int:
        with CaptureQueriesContext(connection) as captured:
            assert as_user("bob").get("/api/v1/jobs/").status_code == 200
        return len(captured)

    for _ in range(3):
        as_user("bob").post("/api/v1/jobs/", GOOD, format="json")
    few = cost()
    for _ in range(20):
        as_user("alice").post("/api/v1/jobs/", GOOD, format="json")
    assert cost() <= few <= 20
