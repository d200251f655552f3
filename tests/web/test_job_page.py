"""The job page: the progress chart has axes and labels, the page shows how long the job waited
and ran, the exit code once, and a resubmit button that submits the same spec as a new job
through the API's submit (CSRF-protected; a viewer may not, another tenant gets 404)."""

import re

from django.test import Client

from apps.jobs import services
from apps.jobs.models import Job, JobState
from tests.web import runs
from tests.web.test_pages import submit


def _text(page: str) -> str:
    return " ".join(re.sub(r"<[^>]+>", " ", page).split())


def _succeeded_job(browser_as) -> Job:
    assert submit(browser_as("bob")).status_code == 302
    job = Job.objects.get()
    attempt = runs.start(job)
    for step in range(1, 5):
        services.attempt_progress(
            attempt_id=attempt.pk, token=str(attempt.token), progress=step / 4
        )
    runs.finish(attempt, exit_code=0)
    runs.backdate(job, started_ago=200, ran=125)
    job.refresh_from_db()
    assert job.state == JobState.SUCCEEDED and job.exit_code == 0
    return job


def test_the_exit_code_is_shown_once(browser_as):
    job = _succeeded_job(browser_as)
    assert job.reason == "exit code 0"  # and the timeline's event and the attempt say it too
    text = _text(browser_as("bob").get(f"/jobs/{job.pk}/").content.decode())
    assert text.count("exit code 0") == 1, text
    assert "exit 0" not in text


def test_the_page_shows_how_long_the_job_waited_and_ran(browser_as):
    job = _succeeded_job(browser_as)
    page = browser_as("bob").get(f"/jobs/{job.pk}/").content.decode()
    times = _text(re.search(r'<p class="flush muted" id="job-times">.*?</p>', page, re.S).group(0))
    assert "ran 2 min 05 s" in times and "waited" in times, times
    submit(browser_as("bob"), name="running", gpus="1")
    running = Job.objects.get(name="running")
    runs.start(running)
    runs.backdate(running, started_ago=65)
    live = browser_as("bob").get(f"/jobs/{running.pk}/", HTTP_HX_REQUEST="true").content.decode()
    assert "running for <strong>1 min 0" in live  # 1 min 05 s, or a second more on a slow run


def test_the_progress_chart_has_axes_and_labels(browser_as):
    job = _succeeded_job(browser_as)
    page = browser_as("bob").get(f"/jobs/{job.pk}/").content.decode()
    chart = re.search(r'<svg id="progress-chart".*?</svg>', page, re.S).group(0)
    assert chart.count("<line") >= 5 and 'class="axis"' in chart  # two axes, grid and ticks
    labels = re.findall(r"<text[^>]*>([^<]*)</text>", chart)
    assert labels[:3] == ["0%", "50%", "100%"]
    assert labels[3] == "0 s" and labels[-1] == "2.1 min", labels  # ran 125 s
    assert " style=" not in chart and 'preserveAspectRatio="none"' not in chart


def test_resubmit_submits_the_same_spec_as_a_new_job(browser_as):
    job = _succeeded_job(browser_as)
    Job.objects.filter(pk=job.pk).update(max_runtime_seconds=1234)
    bob = browser_as("bob")
    assert f'action="/jobs/{job.pk}/resubmit/"' in bob.get(f"/jobs/{job.pk}/").content.decode()
    response = bob.post(f"/jobs/{job.pk}/resubmit/", {"idempotency_key": "web-resubmit-1"})
    assert response.status_code == 302
    again = Job.objects.exclude(pk=job.pk).get()
    assert response["Location"] == f"/jobs/{again.pk}/"
    assert again.state == JobState.QUEUED and again.user.username == "bob"
    for field in ("name", "template_id", "params", "gpus", "nodes", "gpu_sku_id", "tier_id",
                  "max_runtime_seconds"):  # fmt: skip
        assert getattr(again, field) == getattr(Job.objects.get(pk=job.pk), field), field
    assert again.events.filter(to_state="queued", actor="user:bob").exists()
    # A second click of the same rendered button (same key) makes no third job.
    bob.post(f"/jobs/{job.pk}/resubmit/", {"idempotency_key": "web-resubmit-1"})
    assert Job.objects.count() == 2


def test_resubmit_of_a_command_keeps_its_command_and_env(as_user, browser_as):
    body = {"command": ["python", "train.py"], "env": {"LR": "3e-4"}, "gpus": 1}
    first = as_user("bob").post("/api/v1/jobs/", body, format="json").json()
    assert browser_as("bob").post(f"/jobs/{first['id']}/resubmit/").status_code == 302
    again = Job.objects.exclude(pk=first["id"]).get()
    assert again.command == ["python", "train.py"] and again.env == {"LR": "3e-4"}
    assert again.template is None and again.params == {}


def test_resubmit_needs_the_csrf_token_a_submitter_and_the_tenants_job(browser_as, cast):
    job = _succeeded_job(browser_as)
    forged = Client(enforce_csrf_checks=True)
    forged.force_login(cast["bob"][0])
    assert forged.post(f"/jobs/{job.pk}/resubmit/").status_code == 403
    carol = browser_as("carol")  # a viewer of acme
    assert "/resubmit/" not in carol.get(f"/jobs/{job.pk}/").content.decode()
    assert carol.post(f"/jobs/{job.pk}/resubmit/").status_code == 403
    assert browser_as("dave").post(f"/jobs/{job.pk}/resubmit/").status_code == 404
    assert browser_as("bob").get(f"/jobs/{job.pk}/resubmit/").status_code == 405
    assert Job.objects.count() == 1


def test_a_refused_resubmit_says_why_on_the_page(browser_as):
    from apps.tenants.models import Tenant
    from apps.tenants.services import quota_set

    job = _succeeded_job(browser_as)
    quota_set(tenant=Tenant.objects.get(slug="acme"), max_queued_jobs=0)
    page = browser_as("bob").post(f"/jobs/{job.pk}/resubmit/", follow=True).content.decode()
    assert "Not resubmitted" in page and Job.objects.count() == 1
