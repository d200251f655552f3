"""The job page charts progress over time from the agent's 5% progress samples."""

from datetime import timedelta

from django.utils import timezone

from apps.jobs import services
from apps.jobs.models import Job, JobEvent
from apps.scheduling.dispatcher import dispatch_once
from tests.factories import make_node
from tests.web.test_pages import submit


def test_progress_reports_become_samples_and_a_chart(browser_as, cast):
    make_node("h9", gpus=4)
    assert submit(browser_as("bob")).status_code == 302
    job = Job.objects.get()
    dispatch_once()
    attempt = job.attempts.get()
    token = str(attempt.token)
    services.attempt_member_started(attempt_id=attempt.pk, rank=0, token=token, pid=1)
    for step in range(1, 41):  # 40 reports of 2.5% each
        services.attempt_progress(attempt_id=attempt.pk, token=token, progress=step / 40)
    samples = JobEvent.objects.filter(job=job, kind="progress")
    assert samples.count() == 20  # one per 5%, not one per report
    Job.objects.filter(pk=job.pk).update(started_at=timezone.now() - timedelta(seconds=30))
    page = browser_as("bob").get(f"/jobs/{job.pk}/").content.decode()
    assert 'id="progress-chart"' in page and "<polyline" in page
