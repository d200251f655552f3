"""Job and array ids may be shortened to a unique prefix of at least 8 characters wherever the API
takes one (../shared/API.md, v3); an ambiguous prefix is a 400 that says so. Prefixes are looked
up among the caller's tenant's rows only: another tenant's ids never match, and never make a
prefix ambiguous."""

import re
import uuid

import pytest
from django.core.files.base import ContentFile
from django.core.files.storage import default_storage

from apps.jobs.models import Artifact, Job, JobArray

GOOD = {"template": "demo-train", "params": {"steps": 3}, "gpus": 1, "gpu_sku": "H100-80GB"}


def clone(model, row, new_id: str):
    """Another row like `row` under the id `new_id` (ids are random: tests choose them)."""
    fields = {
        f.attname: getattr(row, f.attname) for f in model._meta.concrete_fields if not f.primary_key
    }
    return model.objects.create(id=uuid.UUID(new_id), **fields)


@pytest.fixture
def bobs_job(as_user):
    made = as_user("bob").post("/api/v1/jobs/", GOOD, format="json").json()["id"]
    job = clone(Job, Job.objects.get(pk=made), "1a2b3c4d-0000-4000-8000-000000000001")
    Job.objects.filter(pk=made).delete()
    job.attempts_count = 1
    job.save(update_fields=["attempts_count"])
    default_storage.save(f"logs/{job.pk}/attempt-1.log", ContentFile(b"bob's training log\n"))
    Artifact.objects.create(
        job=job,
        name="result.json",
        file=default_storage.save(f"artifacts/{job.pk}/result.json", ContentFile(b"{}")),
    )
    return job


@pytest.mark.parametrize(
    "prefix", ["1a2b3c4d", "1A2B3C4D", "1a2b3c4d-0000", "1a2b3c4d0000", "1a2b3c4d-0000-4000-8000-000000000001"]
)  # fmt: skip
def test_a_unique_prefix_reads_the_job(as_user, bobs_job, prefix):
    response = as_user("bob").get(f"/api/v1/jobs/{prefix}/")
    assert response.status_code == 200 and response.json()["id"] == str(bobs_job.pk)


@pytest.mark.parametrize("suffix", ["logs/", "artifacts/", "artifacts/result.json"])
def test_a_prefix_reaches_the_jobs_logs_and_artifacts(as_user, bobs_job, suffix):
    response = as_user("bob").get(f"/api/v1/jobs/1a2b3c4d/{suffix}")
    assert response.status_code == 200
    if suffix == "logs/":
        assert b"bob's training log" in response.content


def test_a_prefix_cancels_the_job(as_user, bobs_job):
    response = as_user("bob").post("/api/v1/jobs/1a2b3c4d/cancel/")
    assert response.status_code == 200 and response.json()["state"] == "cancelled"
    again = as_user("bob").post("/api/v1/jobs/1a2b3c4d/cancel/")
    assert again.status_code == 400 and again.json() == {"state": ["job already cancelled"]}


def test_an_ambiguous_prefix_is_a_400_that_says_so(as_user, bobs_job):
    clone(Job, bobs_job, "1a2b3c4d-ffff-4000-8000-000000000002")
    for suffix in ("", "logs/", "artifacts/"):
        response = as_user("bob").get(f"/api/v1/jobs/1a2b3c4d/{suffix}")
        assert response.status_code == 400, suffix
        (message,) = response.json()["id"]
        assert "ambiguous" in message and "1a2b3c4d-0000" in message and "1a2b3c4d-ffff" in message
    assert as_user("bob").post("/api/v1/jobs/1a2b3c4d/cancel/").status_code == 400
    assert as_user("bob").get("/api/v1/jobs/1a2b3c4d-f/").json()["id"].startswith("1a2b3c4d-ffff")


def test_a_prefix_shorter_than_8_is_a_404_that_says_why(as_user, bobs_job):
    response = as_user("bob").get("/api/v1/jobs/1a2b3c4/")
    assert response.status_code == 404 and "at least 8 characters" in response.json()["detail"]


def test_another_tenants_job_never_matches_nor_makes_a_prefix_ambiguous(as_user, bobs_job):
    daves = as_user("dave").post("/api/v1/jobs/", GOOD, format="json").json()["id"]
    dave_job = clone(Job, Job.objects.get(pk=daves), "1a2b3c4d-eeee-4000-8000-000000000003")
    # Each sees only their own under the shared prefix: not ambiguous for either.
    assert as_user("bob").get("/api/v1/jobs/1a2b3c4d/").json()["id"] == str(bobs_job.pk)
    assert as_user("dave").get("/api/v1/jobs/1a2b3c4d/").json()["id"] == str(dave_job.pk)
    for suffix in ("", "logs/", "artifacts/", "artifacts/result.json"):
        assert as_user("dave").get(f"/api/v1/jobs/1a2b3c4d-00/{suffix}").status_code == 404
    assert as_user("dave").post("/api/v1/jobs/1a2b3c4d-00/cancel/").status_code == 404
    assert as_user("bob").get("/api/v1/jobs/1a2b3c4d-ee/").status_code == 404


@pytest.fixture
def bobs_array(as_user):
    body = {**GOOD, "array": "0-3"}
    made = as_user("bob").post("/api/v1/jobs/", body, format="json").json()["id"]
    array = JobArray.objects.get(pk=made)
    return array, clone(JobArray, array, f"{made[:8]}-0000-4000-8000-000000000009")


def test_a_prefix_reads_cancels_and_lists_an_array(as_user, bobs_array):
    array, twin = bobs_array
    twin.delete()
    prefix = str(array.pk)[:8]
    bob = as_user("bob")
    assert bob.get(f"/api/v1/arrays/{prefix}/").json()["id"] == str(array.pk)
    tasks = bob.get(f"/api/v1/jobs/?array={prefix}").json()
    assert tasks["count"] == 4 and {t["array"] for t in tasks["results"]} == {str(array.pk)}
    assert as_user("dave").get(f"/api/v1/arrays/{prefix}/").status_code == 404
    assert as_user("dave").get(f"/api/v1/jobs/?array={prefix}").status_code == 404
    assert bob.post(f"/api/v1/arrays/{prefix}/cancel/").status_code == 200
    assert bob.get(f"/api/v1/jobs/?array={prefix[:5]}").json() == {
        "array": ["must be a job array's id, or a unique prefix of it of at least 8 characters"]
    }


def test_an_ambiguous_array_prefix_is_a_400(as_user, bobs_array):
    array, _twin = bobs_array
    prefix = str(array.pk)[:8]
    response = as_user("bob").get(f"/api/v1/arrays/{prefix}/")
    assert response.status_code == 400 and "ambiguous" in response.json()["id"][0]
    listing = as_user("bob").get(f"/api/v1/jobs/?array={prefix}")
    assert listing.status_code == 400 and "ambiguous" in listing.json()["array"][0]


def test_the_document_takes_prefixes_and_lists_the_ambiguous_400(cast):
    from rest_framework.test import APIClient

    document = APIClient().get("/api/schema/", {"format": "json"}).json()
    for path in ("/api/v1/jobs/{id}/", "/api/v1/jobs/{id}/logs/", "/api/v1/arrays/{id}/"):
        operation = document["paths"][path]["get"]
        (parameter,) = [p for p in operation["parameters"] if p["name"] == "id"]
        assert re.match(parameter["schema"]["pattern"], "1a2b3c4d"), path
        assert "400" in operation["responses"], path


def test_depends_on_takes_a_prefix_of_the_tenants_own_jobs_and_arrays(
    as_user, bobs_job, bobs_array
):
    array, twin = bobs_array
    twin.delete()
    body = {
        **GOOD,
        "depends_on": [{"job": "1a2b3c4d"}, {"array": str(array.pk)[:8], "condition": "afterany"}],
    }
    response = as_user("bob").post("/api/v1/jobs/", body, format="json")
    assert response.status_code == 201, response.json()
    parents = Job.objects.get(pk=response.json()["id"]).dependencies.order_by("position")
    assert [(d.parent_job_id, d.parent_array_id) for d in parents] == [
        (bobs_job.pk, None),
        (None, array.pk),
    ]

    refused = as_user("dave").post(
        "/api/v1/jobs/", {**GOOD, "depends_on": [{"job": "1a2b3c4d"}]}, format="json"
    )
    assert refused.status_code == 404 and refused.json() == {"depends_on": ["no job 1a2b3c4d"]}


def test_an_ambiguous_prefix_in_depends_on_is_a_400_naming_it(as_user, bobs_job):
    clone(Job, bobs_job, "1a2b3c4d-ffff-4000-8000-000000000002")
    body = {**GOOD, "depends_on": [{"job": "1a2b3c4d", "condition": "afterok"}]}
    response = as_user("bob").post("/api/v1/jobs/", body, format="json")
    assert response.status_code == 400 and "ambiguous" in response.json()["depends_on"][0]


def test_the_pages_take_a_prefix_and_redirect_to_the_one_they_name(
    bobs_job, bobs_array, django_user_model
):
    from django.test import Client

    array, _ = bobs_array
    browser, other = Client(), Client()
    browser.force_login(django_user_model.objects.get(username="bob"))
    other.force_login(django_user_model.objects.get(username="dave"))
    page = browser.get("/jobs/1a2b3c4d/")
    assert page.status_code == 302 and page.url == f"/jobs/{bobs_job.pk}/"
    assert browser.get(page.url).status_code == 200
    assert other.get("/jobs/1a2b3c4d/").status_code == 404  # another tenant's: no such job
    assert browser.get("/jobs/1a2b/").status_code == 404  # too short to be a prefix
    clone(Job, bobs_job, "1a2b3c4d-ffff-4000-8000-000000000002")
    ambiguous = browser.get("/jobs/1a2b3c4d/")
    assert ambiguous.status_code == 400 and b"ambiguous" in ambiguous.content
    assert browser.get(f"/arrays/{str(array.pk)[:8]}/").status_code == 400  # the clone shares it
    assert browser.get(f"/arrays/{str(array.pk)[:13]}/").url == f"/arrays/{array.pk}/"


def test_a_submit_without_depends_on_builds_no_parent_lookup(as_user, monkeypatch):
    """The prefix lookup's querysets are built only for a body that names parents: a tenth of a
    plain submit's CPU went to building two it never read (bench/_profile_submit.py)."""
    from apps.jobs import api

    def refused(user):
        raise AssertionError("a parent lookup built for a submit without depends_on")

    monkeypatch.setattr(api, "visible_jobs", refused)
    monkeypatch.setattr(api, "visible_arrays", refused)
    response = as_user("bob").post("/api/v1/jobs/", GOOD, format="json")
    assert response.status_code == 201, response.content
