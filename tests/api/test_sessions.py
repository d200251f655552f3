"""`POST /api/v1/jobs/{id}/sessions/` (docs/interactive.md): who may open a shell, an exec or a
port-forward on which job, the caps, the audit events; and the submit's `interactive` fields."""

import pytest
from django.test import override_settings

from apps.jobs import services
from apps.jobs.models import Job, JobEvent
from apps.jobs.selectors import assignment
from apps.platform.agent_protocol import INTERACTIVE_HOLD
from apps.platform.redis import shared_client
from apps.scheduling import sessions
from apps.scheduling.dispatcher import dispatch_once


@pytest.fixture(autouse=True)
def _no_slots_of_earlier_tests():
    """Slots are counted by user id in Redis, which outlives each test's database."""
    conn = shared_client()
    for key in conn.scan_iter(f"{sessions.SLOTS}*"):
        conn.delete(key)


def running(as_user, user="bob", **body) -> Job:
    body = {
        name: value
        for name, value in {"command": ["sleep", "60"], "gpus": 1, **body}.items()
        if value is not None
    }
    answer = as_user(user).post("/api/v1/jobs/", body, format="json")
    assert answer.status_code == 201, answer.json()
    dispatch_once()
    job = Job.objects.get(pk=answer.json()["id"])
    attempt = job.attempts.get()
    for member in attempt.members.all():
        services.attempt_member_started(
            attempt_id=attempt.pk, rank=member.rank, token=str(attempt.token), pid=1
        )
    job.refresh_from_db()
    assert job.state == "running"
    return job


def open_session(as_user, user, job, **body):
    body = {
        name: value
        for name, value in {"kind": "exec", "argv": ["true"], **body}.items()
        if value is not None
    }
    return as_user(user).post(f"/api/v1/jobs/{job.pk}/sessions/", body, format="json")


def test_a_member_opens_a_session_on_their_own_job_and_it_is_audited(as_user):
    job = running(as_user, "bob")
    answer = open_session(as_user, "bob", job)
    assert answer.status_code == 201, answer.json()
    opened = answer.json()
    assert opened["node"] == "h1" and opened["url"] == f"/api/v1/sessions/{opened['session']}/"
    event = JobEvent.objects.get(job=job, kind="session")
    assert event.actor == "bob" and event.data["kind"] == "exec" and event.data["event"] == "start"
    record = sessions.check_ticket(opened["session"], opened["ticket"])
    assert record["node"] == "h1" and record["who"] == "bob"
    assert sessions.check_ticket(opened["session"], opened["ticket"]) is None  # one use only
    assert open_session(as_user, "alice", job).status_code == 201  # the tenant's admin


def test_another_tenant_gets_404_a_viewer_403_and_staff_403_unless_the_operator_allows(as_user):
    job = running(as_user, "bob")
    assert open_session(as_user, "dave", job).status_code == 404
    assert open_session(as_user, "carol", job).status_code == 403
    refused = open_session(as_user, "staff", job)
    assert refused.status_code == 403 and "GPUPLATFORM_STAFF_CAN_ATTACH" in str(refused.json())
    with override_settings(STAFF_CAN_ATTACH=True):
        assert open_session(as_user, "staff", job).status_code == 201
    audited = JobEvent.objects.get(job=job, kind="session")
    assert audited.actor == "staff (support staff)" and audited.data["staff"] is True
    assert open_session(as_user, None, job).status_code == 401


def test_a_session_opens_by_the_jobs_id_prefix_among_the_callers_jobs_only(as_user):
    job = running(as_user, "bob")
    prefix = str(job.pk)[:8]
    opened = as_user("bob").post(f"/api/v1/jobs/{prefix}/sessions/", {"kind": "exec", "argv": ["true"]},
                                 format="json")  # fmt: skip
    assert opened.status_code == 201, opened.json()
    assert JobEvent.objects.filter(job=job, kind="session").count() == 1
    other = as_user("dave").post(f"/api/v1/jobs/{prefix}/sessions/", {"kind": "exec", "argv": ["true"]},
                                 format="json")  # fmt: skip
    assert other.status_code == 404


def test_a_session_wants_a_running_job_a_known_rank_and_whole_input(as_user):
    job = running(as_user, "bob")
    assert open_session(as_user, "bob", job, kind="shell").json() == {
        "kind": ["a shell is for an interactive job; use exec for this one"]
    }
    assert "argv" in open_session(as_user, "bob", job, argv=[]).json()
    assert "port" in open_session(as_user, "bob", job, kind="forward", argv=None).json()
    assert "rank" in open_session(as_user, "bob", job, rank=3).json()
    assert "kind" in open_session(as_user, "bob", job, kind="telnet").json()
    queued = (
        as_user("bob").post("/api/v1/jobs/", {"command": ["true"], "gpus": 8}, format="json").json()
    )
    waiting = as_user("bob").post(f"/api/v1/jobs/{queued['id']}/sessions/", {"kind": "exec", "argv": ["true"]},
                                  format="json")  # fmt: skip
    assert waiting.status_code == 409 and "queued" in str(waiting.json())


@override_settings(MAX_SESSIONS_PER_USER=2)
def test_over_the_session_cap_is_429_with_retry_after(as_user):
    job = running(as_user, "bob")
    assert [open_session(as_user, "bob", job).status_code for _ in range(2)] == [201, 201]
    over = open_session(as_user, "bob", job)
    assert over.status_code == 429 and over["Retry-After"] == str(sessions.RETRY_AFTER_SECONDS)
    assert open_session(as_user, "alice", job).status_code == 201  # another user's own cap


def test_an_interactive_job_holds_its_gpus_and_carries_its_idle_timeout(as_user):
    job = running(as_user, "bob", command=None, interactive=True, idle_timeout_minutes=2.5)
    assert job.name == "shell" and job.interactive
    work = assignment(job.attempts.get().pk, 0, str(job.attempts.get().token))
    assert work.argv == INTERACTIVE_HOLD and work.interactive and work.idle_timeout_seconds == 150
    shell = open_session(as_user, "bob", job, kind="shell", argv=None)
    assert shell.status_code == 201
    spec = sessions.check_ticket(shell.json()["session"], shell.json()["ticket"])["spec"]
    assert '"argv": ["/bin/bash", "-l"]' in spec and '"ends_job": true' in spec
    default = running(as_user, "bob", command=None, interactive=True)
    work = assignment(default.attempts.get().pk, 0, str(default.attempts.get().token))
    assert work.idle_timeout_seconds == 60 * default.tier.interactive_idle_minutes == 1800


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"interactive": True, "template": "demo-train"}, "template"),
        ({"interactive": True, "array": "0-3"}, "array"),
        ({"command": ["true"], "idle_timeout_minutes": 5}, "idle_timeout_minutes"),
        ({"interactive": True, "idle_timeout_minutes": 31}, "idle_timeout_minutes"),
        ({"interactive": True, "idle_timeout_minutes": 0}, "idle_timeout_minutes"),
        ({"interactive": "yes"}, "interactive"),
    ],
)
def test_bad_interactive_submits_are_400_naming_the_field(as_user, body, field):
    answer = as_user("bob").post("/api/v1/jobs/", body, format="json")
    assert answer.status_code == 400 and field in answer.json(), answer.json()


def test_a_tenant_without_commands_may_not_submit_interactive_jobs(as_user):
    answer = as_user("dave").post("/api/v1/jobs/", {"interactive": True}, format="json")
    assert answer.status_code == 403 and "interactive" in answer.json()
