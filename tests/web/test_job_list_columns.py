"""The jobs list and the dashboard: submitted, started, duration, user and GPU-hours for each
row (an array's row for the whole array), and an array whose every task succeeded reads
"succeeded"."""

import re

from apps.jobs.models import Job, JobArray
from tests.web import runs
from tests.web.test_pages import submit


def _row(page: str, marker: str) -> str:
    found = re.search(rf"<tr {marker}.*?</tr>", page, re.S)
    assert found, f"no row {marker}"
    return " ".join(found.group(0).split())


def test_a_row_shows_submitted_started_duration_user_and_gpu_hours(browser_as):
    bob = browser_as("bob")
    assert submit(bob, gpus="2").status_code == 302
    job = Job.objects.get()
    runs.finish(runs.start(job))
    runs.backdate(job, started_ago=7200, ran=5400)  # 1.5 h on 2 GPUs
    job.refresh_from_db()
    for path in ("/jobs/", "/"):
        page = bob.get(path).content.decode()
        head = " ".join(re.search(r"<thead>.*?</thead>", page, re.S).group(0).split())
        for column in ("Submitted", "Started", "Duration", "User", "GPU-h"):
            assert f">{column}</th>" in head, (path, column)
        row = _row(page, f'data-job="{job.pk}"')
        assert ">1 h 30 min</td>" in row and ">3.00</td>" in row and ">bob</td>" in row, row
        assert job.created_at.strftime("%Y-%m-%d %H:%M:%S") in row
        assert job.started_at.strftime("%Y-%m-%d %H:%M:%S") in row  # in full in its title
        assert f">{job.started_at.strftime('%b %-d %H:%M')}</td>" in row


def test_a_running_job_shows_its_time_so_far_and_a_queued_one_none(browser_as):
    bob = browser_as("bob")
    submit(bob, name="running-one")
    running = Job.objects.get()
    runs.start(running)
    runs.backdate(running, started_ago=125)
    submit(bob, name="waiting-one", gpus="8")
    waiting = Job.objects.get(name="waiting-one")
    page = bob.get("/jobs/").content.decode()
    assert '<td class="duration">2 min 05 s</td>' in _row(page, f'data-job="{running.pk}"')
    assert '<td class="duration"></td>' in _row(page, f'data-job="{waiting.pk}"')


def test_an_array_whose_every_task_succeeded_reads_succeeded(as_user, browser_as):
    body = {"template": "demo-train", "params": {"steps": 2}, "gpus": 1, "gpu_sku": "H100-80GB"}
    made = as_user("bob").post("/api/v1/jobs/", {**body, "array": "0-1"}, format="json").json()
    array = JobArray.objects.get(pk=made["id"])
    for _ in range(2):
        runs.dispatch_once()
        for task in Job.objects.filter(array=array, state="starting"):
            runs.finish(runs.start(task))
    array.refresh_from_db()
    assert array.ended_at is not None and set(array.tasks.values_list("state", flat=True)) == {
        "succeeded"
    }
    row = _row(browser_as("bob").get("/jobs/").content.decode(), f'data-array="{array.pk}"')
    assert 'data-state="succeeded"' in row and "ended" not in row
    assert ">bob</td>" in row and '<td class="duration">' in row
