"""The 201 of a submit (apps/jobs/serializers.py `created_representation`) reads a job's own
columns by `getattr` instead of DRF's `Field.get_attribute`: its rendered bytes must be exactly
what DRF's own `Serializer.to_representation` gives with the same serializer (the 201 as it was
before), for jobs of every shape a submit makes: a template with params, the command job,
no SKU, a node selector, env and limits, an array's task, a job held by its
dependency, an interactive one, one with a bundle's python settings; and through the API."""

from datetime import timedelta

import pytest
from django.utils import timezone
from rest_framework.renderers import JSONRenderer

from apps.jobs.models import Job
from apps.jobs.serializers import CreatedJobSerializer, JobSerializer, created_representation
from tests.admission.conftest import TRAIN, generous
from tests.factories import make_cast, make_node

pytestmark = pytest.mark.django_db


def drfs_own(job, *, position, start) -> bytes:
    """The 201 as DRF's loop over the fields builds it (main's CreatedJobSerializer)."""
    serializer = CreatedJobSerializer()
    serializer.position, serializer.start = position, start
    return JSONRenderer().render(JobSerializer.to_representation(serializer, job))


def same(job, *, position=None, start=None):
    fast = JSONRenderer().render(created_representation(job, position=position, start=start))
    assert fast == drfs_own(job, position=position, start=start)
    return fast


@pytest.fixture
def bob():
    from tests.factories import client_for

    people = make_cast()
    make_node("h1", "H100-80GB", 8, labels={"zone": "a"})
    generous("acme")
    return client_for(people["bob"][1])


BODIES = [
    TRAIN,
    {"command": ["python", "-c", "print(1)"], "gpus": 0},
    {**TRAIN, "gpu_sku": None, "name": "any"},
    {"command": ["true"], "gpus": 1, "node_selector": {"zone": "a"}, "cpu_weight": 200},
    {"command": ["true"], "gpus": 1, "env": {"A": "1", "B": "two"}, "max_runtime_seconds": 60},
    {"command": ["true"], "gpus": 1, "retry_on_failure": True, "memory_mib": 512, "pids_max": 64},
    {"command": ["sleep", "5"], "gpus": 1, "interactive": True, "idle_timeout_minutes": 2.5},
    {**TRAIN, "array": "0-3"},
]


def test_every_shape_of_created_job_renders_the_same_bytes(bob):
    made = []
    for body in BODIES:
        answer = bob.post("/api/v1/jobs/", body, format="json")
        assert answer.status_code == 201, (body, answer.content)
        made.append(answer.json().get("first_job") or answer.json()["id"])
    parent = made[0]
    held = bob.post(
        "/api/v1/jobs/",
        {**TRAIN, "depends_on": [{"job": parent, "condition": "afterok"}]},
        format="json",
    )
    assert held.status_code == 201, held.content
    made.append(held.json()["id"])
    jobs = Job.objects.select_related("tenant", "user", "tier", "gpu_sku", "template", "array")
    checked = 0
    for job in jobs.filter(tenant__slug="acme"):
        for position, start in [(None, None), (3, timezone.now() + timedelta(minutes=7))]:
            same(job, position=position, start=start)
        checked += 1
    assert checked >= len(made)


def test_a_finished_and_a_failed_job_render_the_same_bytes(bob):
    """Not what a submit answers with, but the fields' values are wider there (times, an exit
    code, a reason no longer relative): the fast path still matches."""
    answer = bob.post("/api/v1/jobs/", TRAIN, format="json")
    now = timezone.now()
    Job.objects.filter(pk=answer.json()["id"]).update(
        state="failed", exit_code=3, reason="exit 3", started_at=now, finished_at=now, progress=0.5,
        not_before=now + timedelta(hours=2), cache_hit=True,
    )  # fmt: skip
    same(Job.objects.select_related("tenant", "user", "tier", "gpu_sku", "template").get())


def test_the_201_through_the_api_is_drfs_own_answer(bob):
    for body in BODIES[:3]:
        answer = bob.post("/api/v1/jobs/", body, format="json")
        created = answer.json()
        job = Job.objects.select_related("tenant", "user", "tier", "gpu_sku", "template").get(
            pk=created["id"]
        )
        start = job.created_at if created["estimated_start_at"] else None
        expected = drfs_own(job, position=created["queue_position"], start=start)
        if start is not None:  # the estimate is the replay's: compare the rest, then its shape
            created.pop("estimated_start_at")
            import json

            expected_dict = json.loads(expected)
            expected_dict.pop("estimated_start_at")
            assert created == expected_dict and list(created) == list(expected_dict)
        else:
            assert answer.content == expected


def test_the_plan_reads_the_jobs_own_columns_and_leaves_the_rest_to_drf():
    plan = {name: column for name, column, _ in CreatedJobSerializer().plan()}
    assert list(plan) == list(JobSerializer().fields)  # every field, in order
    assert plan["id"] == "id" and plan["created_at"] == "created_at" and plan["env"] == "env"
    for name in ("tenant", "user", "tier", "gpu_sku", "template", "array", "attempts",
                 "queue_position", "estimated_start_at", "depends_on"):  # fmt: skip
        assert plan[name] is None, name
