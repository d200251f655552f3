"""`/api/v1/jobs/{id}/events/`: every state in order, progress, log lines, then `end`; resumes
from Last-Event-ID without repeats; outsiders get 404 and strangers 401."""

import json
import time

import pytest
from asgiref.sync import async_to_sync
from django.core.files.base import ContentFile
from django.core.files.storage import default_storage

from apps.jobs.models import Job, JobState
from apps.jobs.services import transition_job
from tests.factories import client_for

# The streams' poller (apps/jobs/event_hub.py) reads from its own thread and connection: the
# tests' data must be committed for it to see.
pytestmark = pytest.mark.django_db(transaction=True)

GOOD = {"template": "demo-train", "params": {"steps": 3}, "gpus": 1, "gpu_sku": "H100-80GB"}


def parse(body: str) -> list[dict]:
    messages = []
    for block in body.split("\n\n"):
        fields = {}
        for line in block.splitlines():
            if line.startswith(":") or ":" not in line:
                continue
            key, _, value = line.partition(":")
            fields[key] = value.lstrip(" ")
        if "event" in fields:
            messages.append(
                {
                    "id": fields.get("id"),
                    "event": fields["event"],
                    "data": json.loads(fields["data"]),
                }
            )
    return messages


def stream(client, job_id, **headers) -> list[dict]:
    response = client.get(
        f"/api/v1/jobs/{job_id}/events/?timeout=2", HTTP_ACCEPT="text/event-stream", **headers
    )
    assert response.status_code == 200 and response["Content-Type"] == "text/event-stream"
    return parse(body_of(response))


def body_of(response) -> str:
    """The whole stream (an async iterator: the view serves it on the ASGI server's loop)."""

    async def collect():
        return b"".join([part async for part in response.streaming_content])

    return async_to_sync(collect)().decode()


@pytest.fixture
def finished_job(as_user):
    job_id = as_user("bob").post("/api/v1/jobs/", GOOD, format="json").json()["id"]
    job = Job.objects.get(pk=job_id)
    for to in (JobState.STARTING, JobState.RUNNING, JobState.SUCCEEDED):
        assert transition_job(job, to=to, expect=[job.state], actor="test", reason=f"now {to}")
    Job.objects.filter(pk=job.pk).update(progress=1.0, attempts_count=1, exit_code=0)
    default_storage.save(
        f"logs/{job_id}/attempt-1.log", ContentFile(b"step 1/3\nstep 2/3\nstep 3/3\ndone")
    )
    return job_id


def test_a_client_sees_every_state_in_order_then_progress_logs_and_end(as_user, finished_job):
    messages = stream(as_user("bob"), finished_job)
    states = [m["data"]["to"] for m in messages if m["event"] == "state"]
    assert states == ["queued", "starting", "running", "succeeded"]
    assert [m["data"]["line"] for m in messages if m["event"] == "log"] == [
        "step 1/3",
        "step 2/3",
        "step 3/3",
        "done",
    ]
    assert [m["data"]["progress"] for m in messages if m["event"] == "progress"] == [1.0]
    assert messages[-1]["event"] == "end" and messages[-1]["data"] == {
        "state": "succeeded",
        "exit_code": 0,
    }


def test_reconnecting_with_last_event_id_resumes_without_repeats(as_user, finished_job):
    first = stream(as_user("bob"), finished_job)
    second_state = [m for m in first if m["event"] == "state"][1]
    again = stream(as_user("bob"), finished_job, HTTP_LAST_EVENT_ID=second_state["id"])
    assert [m["data"]["to"] for m in again if m["event"] == "state"] == ["running", "succeeded"]
    assert [m["data"]["line"] for m in again if m["event"] == "log"] == [
        "step 1/3",
        "step 2/3",
        "step 3/3",
        "done",
    ]
    after_logs = [m for m in first if m["event"] == "log"][1]
    rest = stream(as_user("bob"), finished_job, HTTP_LAST_EVENT_ID=after_logs["id"])
    assert [m["data"]["line"] for m in rest if m["event"] == "log"] == ["step 3/3", "done"]
    assert not [m for m in rest if m["event"] == "state"]


def test_a_live_job_streams_until_the_timeout_and_holds_back_a_partial_line(as_user):
    job_id = as_user("bob").post("/api/v1/jobs/", GOOD, format="json").json()["id"]
    job = Job.objects.get(pk=job_id)
    transition_job(job, to=JobState.STARTING, expect=[JobState.QUEUED], actor="test")
    Job.objects.filter(pk=job_id).update(attempts_count=1, progress=0.25)
    default_storage.save(f"logs/{job_id}/attempt-1.log", ContentFile(b"step 1/4\nstep 2"))
    started = time.monotonic()
    messages = stream(as_user("alice"), job_id)
    assert 1.5 < time.monotonic() - started < 10
    assert [m["data"]["to"] for m in messages if m["event"] == "state"] == ["queued", "starting"]
    assert [m["data"]["line"] for m in messages if m["event"] == "log"] == ["step 1/4"]
    assert not [m for m in messages if m["event"] == "end"]


def test_the_web_session_may_follow_the_stream(browser_as, finished_job):
    messages = stream(browser_as("carol"), finished_job)
    assert messages[-1]["event"] == "end"


def test_another_tenant_gets_404_and_no_token_gets_401(as_user, finished_job):
    for accept in ("text/event-stream", "application/json"):
        dave = as_user("dave").get(f"/api/v1/jobs/{finished_job}/events/", HTTP_ACCEPT=accept)
        assert dave.status_code == 404
        assert (
            as_user(None)
            .get(f"/api/v1/jobs/{finished_job}/events/", HTTP_ACCEPT=accept)
            .status_code
            == 401
        )
    assert client_for("bad-token").get(f"/api/v1/jobs/{finished_job}/events/").status_code == 401
