"""One submit use case (apps/admission/submit.py `submit_job`): the API view (which the CLI and
the SDK call) and the web form both go through it, a field of the submit body reaches the job
through one path, and queue order is one definition that every count of it agrees with."""

import pytest
from django.utils import timezone
from rest_framework.exceptions import PermissionDenied, ValidationError

from apps.admission import estimates, rows
from apps.admission import submit as submit_module
from apps.admission.errors import RateLimited
from apps.admission.submit import submit_job
from apps.jobs import queue_order
from apps.jobs.models import Job
from apps.jobs.serializers import (
    ARRAY_FIELDS,
    RELATION_FIELDS,
    JobSerializer,
    JobSubmitSerializer,
)
from apps.jobs.services import SPEC_FIELDS, JobSpec
from apps.scheduling.dispatcher import queue_order as dispatcher_queue_order
from apps.scheduling.dispatcher import queue_position
from apps.tenants.models import Tenant, Tier
from apps.tenants.services import quota_set
from tests.admission.conftest import TRAIN
from tests.factories import client_for


def test_the_api_and_the_web_form_both_submit_through_submit_job(cast, as_user, monkeypatch):
    calls = []

    def spy(**kwargs):
        calls.append(kwargs["body"] if isinstance(kwargs["body"], dict) else kwargs["body"]())
        return submit_module.submit_job(**kwargs)

    monkeypatch.setattr("apps.jobs.api.submit_job", spy)
    monkeypatch.setattr("apps.web.submit.submit_job", spy)
    assert as_user("bob").post("/api/v1/jobs/", TRAIN, format="json").status_code == 201
    from django.test import Client

    web = Client()
    web.force_login(cast["bob"][0])
    form = {
        "template": "demo-train",
        "param_steps": "2",
        "gpus": "1",
        "gpu_sku": "H100-80GB",
        "idempotency_key": "web-1",
    }
    assert web.post("/jobs/new/", form).status_code == 302
    assert [body["template"] for body in calls] == ["demo-train", "demo-train"]
    assert Job.objects.filter(user__username="bob").count() == 2


def test_submit_job_creates_replays_and_refuses_as_the_api_answers(cast):
    bob, carol, staff = cast["bob"][0], cast["carol"][0], cast["staff"][0]
    created = submit_job(user=bob, body=TRAIN, idempotency_key="k1")
    assert created.created and created.job.state == "queued" and not created.job._state.adding
    replayed = submit_job(user=bob, body=TRAIN, idempotency_key="k1")
    assert (replayed.job.pk, replayed.created) == (created.job.pk, False)
    with pytest.raises(PermissionDenied):
        submit_job(user=carol, body=TRAIN, idempotency_key=None)  # a viewer
    with pytest.raises(PermissionDenied):
        submit_job(user=staff, body=TRAIN, idempotency_key=None)  # in no tenant
    with pytest.raises(ValidationError) as error:
        submit_job(user=bob, body=[TRAIN], idempotency_key=None)
    assert error.value.detail == {"body": ["must be a JSON object"]}
    with pytest.raises(ValidationError) as error:
        submit_job(user=bob, body={**TRAIN, "template": "no-such"}, idempotency_key=None)
    assert "template" in error.value.detail


def test_the_rate_limits_headers_come_with_a_refusal_too(cast):
    quota_set(tenant=Tenant.objects.get(slug="acme"), submit_rate_per_minute=1, submit_burst=1)
    bob = cast["bob"][0]
    submit_job(user=bob, body=TRAIN, idempotency_key=None)
    headers: dict = {}
    with pytest.raises(RateLimited):
        submit_job(user=bob, body=TRAIN, idempotency_key=None, headers=headers)
    assert headers["X-RateLimit-Remaining"] == "0"
    response = client_for(cast["bob"][1]).post("/api/v1/jobs/", TRAIN, format="json")
    assert (
        response.status_code == 429
        and response["X-RateLimit-Remaining"] == "0"
        and response["Retry-After"]
    )


def test_every_field_of_the_submit_body_is_a_spec_field_and_comes_back_in_the_job_object():
    """Adding a field to the submit body touches three files: apps/jobs/models.py (and the
    migration makemigrations writes), apps/jobs/serializers.py (the input field, and its name in
    JobSerializer.Meta.fields) and apps/jobs/services.py (JobSpec). new_job copies every spec
    field to the job, spec_from every plain body field to the spec, the INSERT follows the model."""
    job_fields = {field.name for field in Job._meta.get_fields()}
    assert set(SPEC_FIELDS) <= job_fields
    body = set(JobSubmitSerializer().fields) - set(RELATION_FIELDS) - set(ARRAY_FIELDS)
    assert body <= set(SPEC_FIELDS)
    assert set(RELATION_FIELDS) <= set(JobSerializer.Meta.fields)  # passed beside the spec, shown
    assert set(SPEC_FIELDS) <= set(JobSerializer.Meta.fields)
    assert SPEC_FIELDS == tuple(JobSpec.__dataclass_fields__)


def test_queue_order_is_one_order_for_the_dispatcher_queue_position_and_the_201(cast):
    bob, dave = cast["bob"][0], cast["dave"][0]
    acme, globex = Tenant.objects.get(slug="acme"), Tenant.objects.get(slug="globex")
    tiers = {t.name: t for t in Tier.objects.all()}
    made = []
    for tenant, user, tier in [(globex, dave, "free"), (globex, dave, "pro"), (acme, bob, "enterprise"),
                               (globex, dave, "pro"), (acme, bob, "free"), (acme, bob, "enterprise")]:  # fmt: skip
        made.append(Job.objects.create(name="j", tenant=tenant, user=user, tier=tiers[tier]))
    by_key = sorted(
        made, key=lambda j: queue_order.sort_key(j.tier.level, j.tier.rank, j.created_at)
    )
    ordered = [j.pk for j in by_key]
    assert list(dispatcher_queue_order().values_list("pk", flat=True)) == ordered  # the ORM's order
    assert [row[0] for row in rows.queue(100)] == ordered  # the submit path's SQL
    estimator = estimates.Estimator.load()
    for position, job in enumerate(by_key, start=1):
        job = Job.objects.select_related("tier").get(pk=job.pk)
        assert queue_position(job) == position
        assert rows.queued_and_ahead(job) == (len(made), position - 1)
        assert estimator.position(job) == position
    assert [t for t in ordered if t in {made[2].pk, made[5].pk}] == [
        made[2].pk,
        made[5].pk,
    ]  # enterprise first
    assert ordered[:2] == [made[2].pk, made[5].pk]
    Job.objects.filter(pk=made[2].pk).update(state="running", started_at=timezone.now())
    assert queue_position(Job.objects.get(pk=made[5].pk)) == 1


def test_cgroup_limits_come_from_the_body_else_the_template_and_bad_ones_are_400_naming_the_field(
    cast, as_user
):
    from apps.jobs.models import JobTemplate

    JobTemplate.objects.filter(name="demo-train").update(memory_mib=2048, pids_max=512)
    client = as_user("bob")
    answer = client.post(
        "/api/v1/jobs/", {**TRAIN, "memory_mib": 96, "cpu_weight": 300}, format="json"
    )
    assert answer.status_code == 201
    body = answer.json()
    assert (body["memory_mib"], body["pids_max"], body["cpu_weight"]) == (96, 512, 300)
    job = Job.objects.get(pk=body["id"])
    assert (job.memory_mib, job.pids_max, job.cpu_weight) == (96, 512, 300)
    plain = client.post("/api/v1/jobs/", TRAIN, format="json").json()
    assert (plain["memory_mib"], plain["pids_max"], plain["cpu_weight"]) == (2048, 512, 0)
    for field, value in [("memory_mib", -1), ("memory_mib", 2**40), ("pids_max", 2**23),
                         ("cpu_weight", 10001), ("cpu_weight", "lots"), ("pids_max", 1.5)]:  # fmt: skip
        refused = client.post("/api/v1/jobs/", {**TRAIN, field: value}, format="json")
        assert refused.status_code == 400 and field in refused.json(), (
            field,
            value,
            refused.content,
        )
