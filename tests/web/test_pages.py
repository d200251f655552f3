"""The customer pages: sign-in, jobs list and filters, submit form (same serializer and service
as the API), job page, cancel, usage. Outsiders get 404; anonymous visitors go to /login/."""

import pytest
from django.core.files.base import ContentFile
from django.core.files.storage import default_storage

from apps.jobs.models import Artifact, Job, JobEvent, JobState

PAGES = ["/", "/jobs/", "/jobs/new/", "/usage/"]
FORM = {"template": "demo-train", "param_steps": "5", "param_step_seconds": "0.2", "gpus": "2", "nodes": "1",
        "gpu_sku": "H100-80GB"}  # fmt: skip


def submit(client, **changes):
    return client.post("/jobs/new/", {**FORM, **changes})


@pytest.fixture
def bobs_job(browser_as):
    response = submit(browser_as("bob"))
    assert response.status_code == 302, response.content.decode()[:2000]
    return Job.objects.get()


@pytest.mark.parametrize("path", PAGES)
def test_anonymous_visitors_are_sent_to_sign_in(cast, path):
    from django.test import Client

    response = Client().get(path)
    assert response.status_code == 302
    assert response["Location"].startswith("/login/")


def test_anonymous_visitors_are_sent_to_sign_in_from_a_job_page(bobs_job):
    from django.test import Client

    response = Client().get(f"/jobs/{bobs_job.pk}/")
    assert response.status_code == 302 and response["Location"].startswith("/login/")


def test_a_person_signs_in_with_a_password_and_lands_on_the_dashboard(cast):
    from django.test import Client

    user = cast["bob"][0]
    user.set_password("pw-for-bob-1")
    user.save()
    client = Client()
    assert client.get("/login/").status_code == 200
    response = client.post("/login/", {"username": "bob", "password": "pw-for-bob-1"})
    assert response.status_code == 302 and response["Location"] == "/"
    page = client.get("/")
    assert page.status_code == 200 and b"Dashboard" in page.content and b"acme" in page.content


def test_a_wrong_password_is_refused(cast):
    from django.test import Client

    response = Client().post("/login/", {"username": "bob", "password": "nope"})
    assert response.status_code == 200 and b"errorlist" in response.content


@pytest.mark.parametrize("path", PAGES)
def test_every_page_renders_for_a_member_and_for_staff(browser_as, path):
    assert browser_as("bob").get(path).status_code == 200
    assert browser_as("staff").get(path).status_code == 200


def test_the_submit_form_shows_the_templates_parameters_and_free_gpus(browser_as):
    page = browser_as("bob").get("/jobs/new/?template=demo-train").content.decode()
    assert (
        'name="param_steps"' in page
        and 'name="param_step_seconds"' in page
        and 'name="param_fail_at_step"' in page
    )
    assert "H100-80GB — 8 of 8 free now" in page
    infer = browser_as("bob").get("/jobs/new/?template=demo-infer").content.decode()
    assert 'name="param_prompt"' in infer and 'name="param_steps"' not in infer


def test_choosing_a_template_with_htmx_returns_only_its_parameter_fields(browser_as):
    response = browser_as("bob").get("/jobs/new/?template=demo-infer", HTTP_HX_REQUEST="true")
    body = response.content.decode()
    assert body.lstrip().startswith('<fieldset id="params"') and 'name="param_prompt"' in body
    assert 'value="demo-infer"' in body  # the hidden template input travels with the fields


def test_the_form_submits_through_the_same_service_as_the_api(bobs_job):
    job = bobs_job
    assert job.state == JobState.QUEUED and job.user.username == "bob" and job.tenant.slug == "acme"
    assert job.params == {"steps": 5, "step_seconds": 0.2}  # typed like the API's JSON
    assert job.gpus == 2 and job.gpu_sku.name == "H100-80GB" and job.tier.name == "enterprise"
    assert JobEvent.objects.filter(job=job, to_state="queued", actor="user:bob").exists()


@pytest.mark.parametrize(
    "changes, field, message",
    [
        ({"param_steps": "many"}, "param_steps", "must be an integer"),
        ({"param_steps": "0"}, "param_steps", "must be at least 1"),
        ({"param_step_seconds": "999"}, "param_step_seconds", "must be at most 60"),
        ({"gpus": "-1"}, "gpus", "greater than or equal to 0"),
        ({"gpus": "two"}, "gpus", "integer"),
        ({"nodes": "0"}, "nodes", "greater than or equal to 1"),
        ({"gpu_sku": "TPU-v9"}, "gpu_sku", "unknown GPU SKU"),
        ({"template": "no-such"}, "template", "unknown template"),
    ],
)
def test_bad_input_is_shown_next_to_its_field_and_nothing_is_submitted(
    browser_as, changes, field, message
):
    response = submit(browser_as("bob"), **changes)
    assert response.status_code == 400
    page = response.content.decode()
    assert message in page
    if field.startswith("param_"):  # the error follows the field's own input
        assert page.index(message) > page.index(f'name="{field}"')
    assert not Job.objects.exists()


def test_a_tier_above_the_tenants_is_refused_on_the_tier_field(browser_as):
    response = submit(browser_as("dave"), tier="enterprise", gpu_sku="")
    assert response.status_code == 400 and b"may not submit at tier enterprise" in response.content
    assert not Job.objects.exists()


def test_a_viewer_may_not_submit(browser_as):
    assert b"may not submit" in browser_as("carol").get("/jobs/new/").content
    assert submit(browser_as("carol")).status_code == 403
    assert not Job.objects.exists()


def test_a_queued_job_shows_its_queue_position_and_why_it_waits(browser_as, bobs_job):
    Job.objects.filter(pk=bobs_job.pk).update(reason="waiting: no node has 2 free H100-80GB GPUs")
    page = browser_as("bob").get(f"/jobs/{bobs_job.pk}/").content.decode()
    assert 'id="queue-info"' in page and "Position <strong>1</strong>" in page
    assert "no node has 2 free H100-80GB GPUs" in page


def test_the_job_page_shows_log_tail_artifacts_and_the_timeline(browser_as, bobs_job):
    Job.objects.filter(pk=bobs_job.pk).update(
        attempts_count=1, state=JobState.SUCCEEDED, progress=1.0, exit_code=0
    )
    default_storage.save(
        f"logs/{bobs_job.pk}/attempt-1.log", ContentFile(b"step 1/5\nstep 5/5\ndemo-train: done\n")
    )
    Artifact.objects.create(job=bobs_job, name="result.json",
                            file=default_storage.save(f"artifacts/{bobs_job.pk}/result.json", ContentFile(b"{}")))  # fmt: skip
    page = browser_as("alice").get(f"/jobs/{bobs_job.pk}/").content.decode()
    assert "demo-train: done" in page
    assert f'href="/api/v1/jobs/{bobs_job.pk}/artifacts/result.json"' in page
    assert 'data-state="queued"' in page  # the submit event in the timeline
    assert "hx-trigger" not in page  # a finished job stops polling
    download = browser_as("bob").get(f"/api/v1/jobs/{bobs_job.pk}/artifacts/result.json")
    assert download.status_code == 200  # the session serves the API's download too


def test_polling_a_live_job_returns_only_its_live_fragment(browser_as, bobs_job):
    response = browser_as("bob").get(f"/jobs/{bobs_job.pk}/", HTTP_HX_REQUEST="true")
    body = response.content.decode()
    assert body.lstrip().startswith('<div id="job-live"') and 'hx-trigger="every 1s"' in body
    assert "<html" not in body


def test_another_tenants_job_is_not_found(browser_as, bobs_job):
    dave = browser_as("dave")
    assert dave.get(f"/jobs/{bobs_job.pk}/").status_code == 404
    assert dave.post(f"/jobs/{bobs_job.pk}/cancel/").status_code == 404
    assert str(bobs_job.pk) not in dave.get("/jobs/").content.decode()
    assert Job.objects.get().state == JobState.QUEUED


def test_the_owner_cancels_through_the_cancel_service(browser_as, bobs_job):
    page = browser_as("bob").get(f"/jobs/{bobs_job.pk}/").content.decode()
    assert f'action="/jobs/{bobs_job.pk}/cancel/"' in page
    response = browser_as("bob").post(f"/jobs/{bobs_job.pk}/cancel/")
    assert response.status_code == 302
    assert Job.objects.get().state == JobState.CANCELLED
    assert JobEvent.objects.filter(to_state="cancelled", actor="user:bob").exists()
    again = browser_as("bob").post(f"/jobs/{bobs_job.pk}/cancel/", follow=True)
    assert b"already cancelled" in again.content


def test_a_viewer_sees_the_job_but_may_not_cancel_it(browser_as, bobs_job):
    carol = browser_as("carol")
    assert b"Cancel job" not in carol.get(f"/jobs/{bobs_job.pk}/").content
    assert carol.post(f"/jobs/{bobs_job.pk}/cancel/").status_code == 403
    assert Job.objects.get().state == JobState.QUEUED


def test_the_jobs_list_filters_by_state_and_tier(browser_as, bobs_job):
    submit(browser_as("bob"), name="second-run")
    Job.objects.filter(pk=bobs_job.pk).update(state=JobState.SUCCEEDED)
    bob = browser_as("bob")
    assert "second-run" in bob.get("/jobs/?state=queued").content.decode()
    assert "second-run" not in bob.get("/jobs/?state=succeeded").content.decode()
    assert "second-run" in bob.get("/jobs/?tier=enterprise").content.decode()
    assert "second-run" not in bob.get("/jobs/?tier=free").content.decode()
    fragment = bob.get("/jobs/?state=queued", HTTP_HX_REQUEST="true").content.decode()
    assert fragment.lstrip().startswith('<div id="jobs-live"') and "second-run" in fragment


def test_the_usage_page_shows_limits_and_current_use(browser_as, bobs_job):
    page = browser_as("bob").get("/usage/").content.decode()
    assert "queued jobs: <strong>1</strong> of 1000" in page
    assert "GPU hours per day" in page and "600 per minute" in page


def test_a_double_click_submits_once(browser_as):
    bob = browser_as("bob")
    first = submit(bob, idempotency_key="web-same-form")
    second = submit(bob, idempotency_key="web-same-form")
    assert (
        first.status_code == second.status_code == 302 and first["Location"] == second["Location"]
    )
    assert Job.objects.count() == 1


def test_the_form_renders_a_fresh_idempotency_key_each_time(browser_as):
    bob = browser_as("bob")
    keys = [r.context["idempotency_key"] for r in (bob.get("/jobs/new/"), bob.get("/jobs/new/"))]
    assert keys[0] != keys[1] and all(k.startswith("web-") for k in keys)


def test_the_submit_rate_limit_applies_to_the_form_as_to_the_api(browser_as):
    from apps.tenants.models import Tenant
    from apps.tenants.services import quota_set

    quota_set(tenant=Tenant.objects.get(slug="acme"), submit_rate_per_minute=1, submit_burst=1)
    bob = browser_as("bob")
    assert submit(bob, idempotency_key="web-1").status_code == 302
    refused = submit(bob, idempotency_key="web-2")
    assert refused.status_code == 400 and b"try again in" in refused.content
    assert Job.objects.count() == 1
    assert b"submissions left" in bob.get("/usage/").content
