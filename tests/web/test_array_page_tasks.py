"""The array page: a breadcrumb back to the jobs list; each task's own params, duration and
result; a task that never started reads as cancelled once its array is."""

import re

from apps.jobs.models import Job
from tests.web import runs

TRAIN = {"template": "demo-train", "params": {"steps": 2}, "gpus": 1, "gpu_sku": "H100-80GB"}


def _rows(page: str) -> dict[str, str]:
    rows = re.findall(r"<tr data-(?:job|task)=.*?</tr>", page, re.S)
    return {re.search(r"<td>(?:<a [^>]*>)?(\d+)", r).group(1): " ".join(r.split()) for r in rows}


def test_the_array_page_leads_back_to_the_jobs_list(as_user, browser_as):
    made = as_user("bob").post("/api/v1/jobs/", {**TRAIN, "array": "0-2"}, format="json").json()
    page = browser_as("bob").get(f"/arrays/{made['id']}/").content.decode()
    crumb = re.search(r'<p class="muted breadcrumb">.*?</p>', page, re.S).group(0)
    assert '<a href="/jobs/">Jobs</a>' in crumb


def test_each_task_shows_its_params_duration_and_result(as_user, browser_as):
    body = {
        **TRAIN,
        "array_params": [{"step_seconds": 0.1}, {"step_seconds": 0.2}, {"step_seconds": 0.3}],
        "array": "0-2%2",
    }
    made = as_user("bob").post("/api/v1/jobs/", body, format="json").json()
    runs.dispatch_once()  # two tasks placed (%2), the third not yet a job
    done, failed = Job.objects.filter(array_id=made["id"]).order_by("array_index")
    runs.finish(runs.start(done, dispatch=False), exit_code=0)
    runs.backdate(done, started_ago=100, ran=65)
    runs.finish(runs.start(failed, dispatch=False), exit_code=3)
    page = browser_as("bob").get(f"/arrays/{made['id']}/").content.decode()
    rows = _rows(page)
    assert "Every task: <code>steps=2</code>" in page
    assert "<code>step_seconds=0.1</code>" in rows["0"] and "1 min 05 s" in rows["0"]
    assert ">exit code 0</td>" in rows["0"]
    assert "<code>step_seconds=0.2</code>" in rows["1"] and ">exit code 3</td>" in rows["1"]
    assert "<code>step_seconds=0.3</code>" in rows["2"]  # not a row yet: from the array's params
    assert "not yet a job" in rows["2"]


def test_a_task_that_never_started_reads_as_cancelled(as_user, browser_as):
    made = as_user("bob").post("/api/v1/jobs/", {**TRAIN, "array": "0-3%1"}, format="json").json()
    runs.dispatch_once()
    bob = browser_as("bob")
    assert bob.post(f"/arrays/{made['id']}/cancel/").status_code == 302
    rows = _rows(bob.get(f"/arrays/{made['id']}/").content.decode())
    assert len(rows) == 4
    for index, row in rows.items():
        assert 'data-state="cancelled"' in row and "cancelled before it started" in row, index
        assert "made when the dispatcher can start it" not in row


def test_a_held_arrays_tasks_say_what_they_wait_for(as_user, browser_as):
    parent = as_user("bob").post("/api/v1/jobs/", TRAIN, format="json").json()
    body = {**TRAIN, "array": "0-2", "depends_on": [{"job": parent["id"]}]}
    made = as_user("bob").post("/api/v1/jobs/", body, format="json").json()
    rows = _rows(browser_as("bob").get(f"/arrays/{made['id']}/").content.decode())
    assert len(rows) == 3
    for row in rows.values():
        assert parent["id"] in row and "made when the dispatcher can start it" not in row, row
