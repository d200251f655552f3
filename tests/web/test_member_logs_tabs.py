"""The job page of a gang has a tab per member of its latest attempt, each loading that member's
log from the API as plain text (templates/web/_member_logs.html); a one-node job has none."""

from django.core.files.base import ContentFile
from django.core.files.storage import default_storage

from apps.jobs.models import Job
from apps.platform.agent_protocol import log_name
from apps.scheduling.dispatcher import dispatch_once

GANG = {"template": "demo-train", "params": {"steps": 3}, "gpus": 2, "gpu_sku": "A100-40GB",
        "nodes": 2}  # fmt: skip


def test_a_gangs_page_has_a_tab_per_member_that_loads_its_log(browser_as, as_user, cast):
    from tests.factories import make_node

    make_node("a2", "A100-40GB", 4)
    created = as_user("bob").post("/api/v1/jobs/", GANG, format="json")
    assert created.status_code == 201, created.content
    job_id = created.json()["id"]
    dispatch_once()
    job = Job.objects.get(pk=job_id)
    attempt = job.attempts.get()
    assert attempt.members.count() == 2
    default_storage.save(log_name(job_id, 1, 1), ContentFile(b"<b>rank one</b> step 7\n"))

    bob = browser_as("bob")
    page = bob.get(f"/jobs/{job_id}/").content.decode()
    assert 'id="member-logs"' in page
    for rank in (0, 1):
        assert f'hx-get="/api/v1/jobs/{job_id}/logs/?rank={rank}&amp;attempt=1"' in page
    assert page.count('class="member-tab"') == 2
    assert 'hx-swap="textContent"' in page  # the log is text, never HTML
    # what the tab loads, with the page's own session
    loaded = bob.get(f"/api/v1/jobs/{job_id}/logs/?rank=1&attempt=1")
    assert loaded.status_code == 200 and loaded.content == b"<b>rank one</b> step 7\n"
    assert browser_as("dave").get(f"/api/v1/jobs/{job_id}/logs/?rank=1").status_code == 404


def test_a_one_node_job_has_no_member_tabs(browser_as, as_user, cast):
    created = as_user("bob").post("/api/v1/jobs/", {**GANG, "nodes": 1}, format="json")
    dispatch_once()
    page = browser_as("bob").get(f"/jobs/{created.json()['id']}/").content.decode()
    assert 'id="member-logs"' not in page
