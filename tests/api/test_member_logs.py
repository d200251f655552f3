"""`GET /api/v1/jobs/{id}/logs/?rank=N&attempt=N` (../shared/API.md, v3): each gang member's log,
one attempt's or all of them; a rank or attempt the job does not have is a 404, a malformed one
a 400 naming the parameter, another tenant's job a 404. (The logs come from real agents in
tests/e2e/test_pytorch_jobs.py.)"""

import pytest
from django.core.files.base import ContentFile
from django.core.files.storage import default_storage

from apps.jobs.models import Job
from apps.platform.agent_protocol import log_name

GANG = {"template": "demo-train", "params": {"steps": 3}, "gpus": 1, "gpu_sku": "H100-80GB",
        "nodes": 2}  # fmt: skip


@pytest.fixture
def gang(as_user):
    """A two-member job that ran twice: both members wrote a log each time."""
    response = as_user("bob").post("/api/v1/jobs/", GANG, format="json")
    assert response.status_code == 201, response.content
    job = Job.objects.get(pk=response.json()["id"])
    job.attempts_count = 2
    job.save(update_fields=["attempts_count"])
    for attempt in (1, 2):
        for rank in (0, 1):
            name = log_name(str(job.pk), attempt, rank)
            default_storage.save(name, ContentFile(f"rank {rank} attempt {attempt}\n".encode()))
    return str(job.pk)


def test_rank_0_by_default_every_attempt_under_its_line(as_user, gang):
    response = as_user("bob").get(f"/api/v1/jobs/{gang}/logs/")
    assert response.status_code == 200
    assert response.content.decode() == (
        "=== attempt 1 ===\nrank 0 attempt 1\n=== attempt 2 ===\nrank 0 attempt 2\n"
    )


def test_another_members_log_and_one_attempt_of_it(as_user, gang):
    bob = as_user("bob")
    whole = bob.get(f"/api/v1/jobs/{gang}/logs/?rank=1").content.decode()
    assert whole == "=== attempt 1 ===\nrank 1 attempt 1\n=== attempt 2 ===\nrank 1 attempt 2\n"
    one = bob.get(f"/api/v1/jobs/{gang}/logs/?rank=1&attempt=1")
    assert one.status_code == 200 and one["Content-Type"].startswith("text/plain")
    assert one.content.decode() == "rank 1 attempt 1\n"
    assert bob.get(f"/api/v1/jobs/{gang}/logs/?attempt=2").content.decode() == "rank 0 attempt 2\n"


@pytest.mark.parametrize("query", ["rank=2", "rank=40000", "attempt=3"])
def test_a_rank_or_attempt_the_job_does_not_have_is_404(as_user, gang, query):
    response = as_user("bob").get(f"/api/v1/jobs/{gang}/logs/?{query}")
    assert response.status_code == 404
    assert query.split("=")[0] in response.json()["detail"]


@pytest.mark.parametrize(
    ("query", "field"),
    [("rank=-1", "rank"), ("rank=one", "rank"), ("rank=²", "rank"), ("attempt=0", "attempt"),
     ("attempt=" + "9" * 5000, "attempt"), ("rank=1.0", "rank")],
)  # fmt: skip
def test_a_malformed_rank_or_attempt_is_a_400_naming_it(as_user, gang, query, field):
    response = as_user("bob").get(f"/api/v1/jobs/{gang}/logs/?{query}")
    assert response.status_code == 400
    assert list(response.json()) == [field]


def test_another_tenant_gets_404_for_any_member(as_user, gang):
    assert as_user("dave").get(f"/api/v1/jobs/{gang}/logs/?rank=1").status_code == 404
