"""A batch of agent reports ending several jobs at once (apps/jobs/batch_reports.py) finds their
dependents with one read for all: a dependent of one of them is still released, or failed."""

from apps.jobs.models import Job
from apps.nodes.credentials import issue_credential
from tests.admission.conftest import placed_ids
from tests.unit.test_agent_api import bearer

JOB = {"command": ["true"], "gpus": 1, "gpu_sku": "H100-80GB"}


def submit(client, **extra) -> str:
    response = client.post("/api/v1/jobs/", {**JOB, **extra}, format="json")
    assert response.status_code == 201, response.json()
    return response.json()["id"]


def report_all(ids: list[str]) -> None:
    reports = []
    for job_id in ids:
        attempt = Job.objects.get(pk=job_id).attempts.get()
        head = {"attempt_id": attempt.pk, "rank": 0, "token": str(attempt.token)}
        reports += [
            {**head, "kind": "started", "pid": 1},
            {**head, "kind": "finished", "exit_code": 0},
        ]
    client = bearer(issue_credential(node_name="h1")[1])
    response = client.post("/internal/agent/v1/reports/", {"reports": reports}, format="json")
    assert [r["accepted"] for r in response.json()["results"]] == [True] * len(reports)


def test_a_batch_that_ends_a_parent_among_others_decides_its_dependents(as_user):
    """The fourth job is nobody's parent: the members' read says so and its end reads no
    dependents (apps/jobs/services.py `ReportedMember.awaited`); the others' are decided."""
    bob = as_user("bob")
    parents = [submit(bob) for _ in range(4)]
    released = submit(bob, depends_on=[{"job": parents[1], "condition": "afterok"}])
    failed = submit(bob, depends_on=[{"job": parents[2], "condition": "afternotok"}])
    waiting = submit(bob, depends_on=[{"job": parents[0], "condition": "afterok"},
                                      {"job": released, "condition": "afterok"}])  # fmt: skip
    assert set(parents) <= placed_ids()
    report_all(parents)
    assert set(Job.objects.filter(pk__in=parents).values_list("state", flat=True)) == {"succeeded"}
    assert Job.objects.get(pk=released).held_by_dependencies is False
    assert Job.objects.get(pk=failed).state == "failed"
    assert Job.objects.get(pk=waiting).held_by_dependencies is True  # `released` has not run
