"""A batch's items are checked by one serializer instance a kind for the whole process
(apps/nodes/agent_reports.py `_check`): the answers are those a fresh serializer gives, item by
item, whatever was checked before, and each thread checks a checkpoint against its own item's
job."""

from __future__ import annotations

import threading

import pytest

from apps.nodes import agent_reports
from apps.nodes.agent_reports import (
    FinishedReport,
    LostReport,
    ProgressReport,
    ReportItem,
    StartedReport,
)
from apps.nodes.credentials import issue_credential
from tests.unit.test_agent_api import bearer
from tests.unit.test_agent_batches import API, cast, item, placed  # noqa: F401 (cast: a fixture)

JOB = "6f9c3bde-8f5e-4a57-9a4c-1c2d3e4f5a6b"
OURS = f"checkpoints/{JOB}/step-3"

BODIES = {
    ReportItem: [
        {"attempt_id": 1, "rank": 0, "token": "t", "kind": "started"},
        {"attempt_id": 0, "rank": -1, "token": "x" * 65, "kind": "exploded"},
        {"attempt_id": "one", "rank": None, "kind": "started"},
        {},
        [],
        "junk",
        {"attempt_id": True, "rank": 1.5, "token": "", "kind": ""},
    ],
    StartedReport: [
        {"pid": 7},
        {"pid": 7, "master_port": 29500},
        {"pid": -1, "master_port": 0},
        {"master_port": 70000},
        {"pid": "seven"},
        {"pid": None},
    ],
    ProgressReport: [
        {"progress": 0.5},
        {"progress": 1, "checkpoint": OURS},
        {"progress": 2, "checkpoint": "checkpoints/someone-else/x"},
        {"progress": "half"},
        {"checkpoint": f"checkpoints/{JOB}/../other/x"},
    ],
    FinishedReport: [
        {"exit_code": 0},
        {"exit_code": None, "reason": "oom", "retryable": False, "checkpoint": OURS},
        {"exit_code": 256, "reason": "r" * 301, "checkpoint": "elsewhere"},
        {"exit_code": "0", "retryable": "maybe"},
        {},
        {"exit_code": 1, "checkpoint": "c" * 501},
    ],
    LostReport: [{"reason": "gone"}, {}, {"reason": ""}, {"reason": "x" * 301}],
}


def fresh(serializer_class, data) -> tuple[dict | None, dict | None]:
    """What a serializer made for this one body gives (the single endpoints' way)."""
    serializer = serializer_class(data=data, context={"job_id": JOB})
    if serializer.is_valid():
        return dict(serializer.validated_data), None
    return None, serializer.errors


@pytest.mark.parametrize("serializer_class", list(BODIES), ids=lambda c: c.__name__)
def test_the_shared_check_answers_as_a_fresh_serializer_does_body_after_body(serializer_class):
    """Twice over, so what a body left behind (if anything) would show on the next."""
    shared = agent_reports._check(serializer_class)
    assert agent_reports._check(serializer_class) is shared  # one a process
    agent_reports._BODY.set(job_id=JOB)
    for _ in range(2):
        for data in BODIES[serializer_class]:
            valid, errors = agent_reports._checked(shared, data)
            expected_valid, expected_errors = fresh(serializer_class, data)
            assert (None if valid is None else dict(valid), errors) == (
                expected_valid,
                expected_errors,
            ), data


def test_each_thread_checks_a_checkpoint_against_its_own_items_job():
    """Two threads check the same checkpoint at once, each for its own job: the shared
    instance's context is the thread's."""
    shared = agent_reports._check(FinishedReport)
    start = threading.Barrier(2)
    answers: dict[str, list] = {}

    def check(job: str) -> None:
        agent_reports._BODY.set(job_id=job)
        start.wait(5)
        answers[job] = [
            agent_reports._checked(shared, {"exit_code": 0, "checkpoint": OURS})[1] is None
            for _ in range(200)
        ]

    threads = [threading.Thread(target=check, args=(job,)) for job in (JOB, "another-job")]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert answers == {JOB: [True] * 200, "another-job": [False] * 200}


def test_a_batchs_bad_items_are_answered_with_a_fresh_serializers_errors(cast):  # noqa: F811
    """Through the endpoint: each bad item's errors are those its kind's serializer gives alone."""
    a, b = placed(cast, 2, {"h1": 2})
    checkpoint = f"checkpoints/{b.job_id}/x"
    bad = [
        ({"pid": -1, "master_port": 0}, StartedReport, "started", a),
        ({"exit_code": 256, "reason": "r" * 301, "checkpoint": "elsewhere"}, FinishedReport,
         "finished", b),
        ({"progress": 2, "checkpoint": f"checkpoints/{a.job_id}/x"}, ProgressReport, "progress",
         b),
        ({}, LostReport, "lost", a),
    ]  # fmt: skip
    reports = [item(attempt, kind, **body) for body, _, kind, attempt in bad]
    reports.append(item(b, "progress", progress=0.5, checkpoint=checkpoint))
    client = bearer(issue_credential(node_name="h1")[1])
    results = client.post(f"{API}/reports/", {"reports": reports}, format="json").json()["results"]
    for (body, serializer_class, _, attempt), result in zip(bad, results, strict=False):
        serializer = serializer_class(data=body, context={"job_id": attempt.job_id})
        assert not serializer.is_valid()
        assert result == {"status": 400, "errors": serializer.errors}
    assert results[-1]["status"] == 200  # a good item beside them reaches its service
