"""Support staff's admin: bounded list pages, and the actions call the same services."""

from datetime import timedelta

import pytest
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from apps.jobs.models import Job
from apps.nodes.models import Node
from apps.nodes.services import node_set_state, preempt_past_drain_deadline
from apps.scheduling.dispatcher import dispatch_once
from apps.tenants.models import Tier
from tests.factories import make_node
from tests.unit.test_dispatcher import submit

PAGES = [
    "/admin/jobs/job/",
    "/admin/jobs/job/?state__exact=queued",
    "/admin/jobs/jobattempt/",
    "/admin/jobs/jobevent/",
    "/admin/jobs/gpuallocation/",
    "/admin/nodes/node/",
    "/admin/nodes/gpu/",
    "/admin/tenants/tenant/",
    "/admin/tenants/membership/",
]


@pytest.fixture
def cast(db):
    from tests.factories import make_cast

    return make_cast()


@pytest.fixture
def staff_client(cast):
    client = Client()
    client.force_login(cast["staff"][0])
    return client


def queries_for(client, url) -> int:
    with CaptureQueriesContext(connection) as captured:
        assert client.get(url).status_code == 200, url
    return len(captured)


@pytest.mark.parametrize("url", PAGES)
def test_admin_list_pages_cost_the_same_for_3_rows_as_for_23(cast, staff_client, url):
    make_node("h1", gpus=8)
    for _ in range(3):
        submit(cast, gpus=1)
    dispatch_once()
    few = queries_for(staff_client, url)
    for i in range(20):
        make_node(f"x{i}", gpus=1)
        submit(cast, gpus=1)
    dispatch_once()
    assert queries_for(staff_client, url) <= few <= 25


def test_jobs_filter_by_node(cast, staff_client):
    node = make_node("h1", gpus=2)
    submit(cast, gpus=1)
    dispatch_once()
    response = staff_client.get(f"/admin/jobs/job/?attempts__members__node__id__exact={node.pk}")
    assert response.status_code == 200 and b"1 job" in response.content


def test_bump_priority_moves_a_job_ahead_in_its_tenant(cast, staff_client):
    make_node("h1", gpus=4)
    Tier.objects.update(min_runtime_seconds=10**6)  # no preemption in this test
    first, second = submit(cast, gpus=4), submit(cast, gpus=4)
    response = staff_client.post(
        "/admin/jobs/job/", {"action": "bump_priority", "_selected_action": [second.pk]}
    )
    assert response.status_code == 302
    assert dispatch_once().placed == [str(second.id)]
    assert second.events.filter(kind="note", reason__contains="priority boosted").exists()
    first.refresh_from_db()
    assert first.state == "queued"


def test_a_drained_node_takes_nothing_new_and_preempts_what_runs_after_its_deadline(cast):
    node = make_node("h1", gpus=2)
    job = submit(cast, gpus=1)
    dispatch_once()
    node_set_state(node=node, state="draining", drain_seconds=60)
    later = submit(cast, gpus=1)
    assert dispatch_once().placed == []  # no new placement on a draining node
    assert preempt_past_drain_deadline() == []  # the deadline has not passed
    Node.objects.filter(pk=node.pk).update(drain_deadline=timezone.now() - timedelta(seconds=1))
    assert preempt_past_drain_deadline() == [str(job.id)]
    job.refresh_from_db()
    later.refresh_from_db()
    assert job.state == "preempting" and later.state == "queued"
    assert Job.objects.get(pk=job.pk).reason.startswith("preempting: its node is drained")


def test_a_templates_cgroup_limits_are_bounded_like_the_submit_bodys(db):
    from apps.jobs.admin import JobTemplateForm

    base = {"name": "t1", "argv": '["true"]', "params_schema": "{}", "version": 1,
            "default_max_runtime_seconds": 60, "memory_mib": 0, "pids_max": 0}  # fmt: skip
    assert JobTemplateForm(data={**base, "cpu_weight": 300}).is_valid()
    form = JobTemplateForm(data={**base, "cpu_weight": 10001})
    assert not form.is_valid() and list(form.errors) == ["cpu_weight"]
    assert "memory_mib" in JobTemplateForm(data={**base, "cpu_weight": 0, "memory_mib": -1}).errors


def running_job_with_progress(cast, fractions) -> Job:
    """A job started on a node, its agent's progress reports as they come (services)."""
    from apps.jobs import services

    make_node("p1", gpus=8)
    job = submit(cast, gpus=1)
    dispatch_once()
    attempt = job.attempts.get()
    token = str(attempt.token)
    services.attempt_member_started(attempt_id=attempt.pk, rank=0, token=token, pid=1)
    for fraction in fractions:
        services.attempt_progress(attempt_id=attempt.pk, token=token, progress=fraction)
    job.refresh_from_db()
    return job


def test_progress_shows_as_a_percent(cast, staff_client):
    job = running_job_with_progress(cast, [0.41333333333333333])
    listing = staff_client.get("/admin/jobs/job/").content.decode()
    page = staff_client.get(f"/admin/jobs/job/{job.pk}/change/").content.decode()
    for html in (listing, page):
        assert "41%" in html and "0.4133" not in html


def test_progress_samples_are_no_blank_rows_in_the_audit_log(cast, staff_client):
    """Progress reports make samples (kind "progress", one per 5%: the job page's chart) with a
    value and no text. The job's audit log leaves them out; the JobEvent list says what they are."""
    from apps.jobs.models import JobEvent

    job = running_job_with_progress(cast, [0.1, 0.25, 0.5])
    samples = JobEvent.objects.filter(job=job, kind="progress")
    assert samples.count() == 3 and not any(e.reason for e in samples)  # the data as it was
    response = staff_client.get(f"/admin/jobs/job/{job.pk}/change/")
    [events] = [f for f in response.context["inline_admin_formsets"] if f.formset.model is JobEvent]
    shown = list(events.formset.queryset)
    assert shown and all(event.reason for event in shown)  # transitions, each with its why
    assert {e.kind for e in shown} == {"state"}
    listing = staff_client.get("/admin/jobs/jobevent/").content.decode()
    for text in ("progress 10%", "progress 25%", "progress 50%"):
        assert text in listing
