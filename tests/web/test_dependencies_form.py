"""Job dependencies on the submit page (docs/pipelines.md): one text input in the CLI's
`[condition:][job:|array:]<id>` shapes, refused on the form with the field named (never a 500),
and the dependencies shown on the job's page."""

from __future__ import annotations

import uuid

from apps.admission import buckets  # noqa: F401 (the conftest's fixtures reset them)
from apps.jobs.models import Job, JobDependency

FORM = {"template": "demo-train", "param_steps": "5", "param_step_seconds": "0.2", "gpus": "1",
        "nodes": "1", "gpu_sku": "H100-80GB"}  # fmt: skip
TRAIN = {"template": "demo-train", "params": {"steps": 2}, "gpus": 1, "gpu_sku": "H100-80GB"}


def submitted(client, **fields) -> Job:
    response = client.post("/jobs/new/", {**FORM, **fields})
    assert response.status_code == 302, response.content.decode()[:3000]
    return Job.objects.get(pk=response["Location"].rstrip("/").rsplit("/", 1)[1])


def refused(client, depends_on: str) -> str:
    before = Job.objects.count()
    response = client.post("/jobs/new/", {**FORM, "depends_on": depends_on})
    assert response.status_code == 400, response.content.decode()[:3000]
    assert Job.objects.count() == before  # nothing written
    page = response.content.decode()
    assert f'value="{depends_on}"' in page  # the typed value comes back to be corrected
    return page


def test_a_job_submitted_after_another_waits_for_it_and_shows_it(browser_as):
    bob = browser_as("bob")
    parent = submitted(bob)
    job = submitted(bob, depends_on=f"afterok:{parent.pk}")
    assert job.state == "queued" and job.held_by_dependencies
    row = JobDependency.objects.get(job=job)
    assert (row.parent_job_id, row.condition, row.state) == (parent.pk, "afterok", "pending")
    page = bob.get(f"/jobs/{job.pk}/").content.decode()
    assert 'id="depends-on"' in page
    assert f'<code>afterok</code> job <a href="/jobs/{parent.pk}/">{parent.pk}</a>' in page
    assert "pending" in page and f"waiting for dependency {parent.pk} (afterok)" in page
    assert 'id="depends-on"' not in bob.get(f"/jobs/{parent.pk}/").content.decode()


def test_several_entries_jobs_and_arrays_with_or_without_their_kind(as_user, browser_as):
    bob = browser_as("bob")
    first, second = submitted(bob), submitted(bob)
    array = as_user("bob").post("/api/v1/jobs/", {**TRAIN, "array": "0-1"}, format="json").json()
    job = submitted(
        bob,
        depends_on=f"{first.pk}, afterany:job:{second.pk} afternotok:{array['id']},"
        f" afterok:array:{array['id']}",
    )
    rows = JobDependency.objects.filter(job=job).order_by("position")
    assert [(r.parent_job_id or r.parent_array_id, r.condition) for r in rows] == [
        (first.pk, "afterok"),
        (second.pk, "afterany"),
        (uuid.UUID(array["id"]), "afternotok"),
        (uuid.UUID(array["id"]), "afterok"),
    ]
    page = bob.get(f"/jobs/{job.pk}/").content.decode()
    assert f'array <a href="/arrays/{array["id"]}/">' in page


def test_a_bad_value_is_refused_on_the_form_naming_it(browser_as):
    bob = browser_as("bob")
    page = refused(bob, "afterwards:0b0e9a9c-2f6e-4b36-8a3c-1b8f3f2c9d11")
    assert "afterwards:0b0e9a9c-2f6e-4b36-8a3c-1b8f3f2c9d11: write [condition:]" in page
    assert "is not a job or array id" in refused(bob, "afterok:1234")
    assert "write [condition:]" in refused(bob, "afterok:")


def test_an_unknown_or_another_tenants_id_is_refused_alike(browser_as):
    theirs = submitted(browser_as("dave"))
    nobody = uuid.uuid4()
    bob = browser_as("bob")
    assert f"no job {nobody}" in refused(bob, f"afterok:{nobody}")
    assert f"no job {theirs.pk}" in refused(bob, f"afterok:{theirs.pk}")
    assert f"no array {theirs.pk}" in refused(bob, f"afterany:array:{theirs.pk}")


def test_the_apis_refusals_name_the_entry_as_typed(browser_as):
    bob = browser_as("bob")
    parent = submitted(bob)
    page = refused(bob, f"afterok:{parent.pk}, aftercorr:job:{parent.pk}")
    assert f"aftercorr:job:{parent.pk}: aftercorr is for an array" in page
    # aftercorr without a kind names an array: a job's id is no array's
    assert f"no array {parent.pk}" in refused(bob, f"aftercorr:{parent.pk}")
