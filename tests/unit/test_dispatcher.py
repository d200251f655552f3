"""The dispatcher and the job services against the real database (no Celery: publishes happen
on commit, which these transactional tests never reach)."""

from datetime import timedelta

import pytest
from django.db import IntegrityError
from django.utils import timezone

from apps.admission import enqueue
from apps.jobs import services
from apps.jobs.models import GpuAllocation, Job, JobAttempt
from apps.nodes.models import Gpu, Node
from apps.nodes.services import mark_silent_nodes_lost
from apps.scheduling.dispatcher import dispatch_once
from apps.tenants.models import Tier
from tests.factories import make_cast, make_node


@pytest.fixture
def cast(db):
    return make_cast()


def submit(cast, user="bob", *, tier=None, gpus=1, nodes=1, sku="H100-80GB", selector=None) -> Job:
    from apps.jobs.models import JobTemplate
    from apps.nodes.models import GpuSku

    person = cast[user][0]
    tenant = person.membership.tenant
    spec = services.JobSpec(
        name="t", tier=Tier.objects.get(name=tier) if tier else tenant.tier,
        template=JobTemplate.objects.get(name="demo-train"), params={"steps": 1}, command=None,
        gpus=gpus, nodes=nodes, gpu_sku=GpuSku.objects.get_or_create(name=sku)[0], node_selector=selector or {},
        max_runtime_seconds=60, checkpointable=True, cacheable=False,
    )  # fmt: skip
    return enqueue.job_submit(tenant=tenant, user=person, spec=spec)


def placed_and_started(cast, user="bob", *, gpus=1) -> tuple[Job, JobAttempt]:
    """A job placed by a dispatcher pass whose single member has reported its start."""
    job = submit(cast, user, gpus=gpus)
    dispatch_once()
    attempt = job.attempts.get()
    services.attempt_member_started(attempt_id=attempt.pk, rank=0, token=str(attempt.token), pid=1)
    return job, attempt


def test_it_places_the_higher_tier_first_when_only_one_fits(cast):
    make_node("h1", gpus=4)
    low = submit(cast, "dave", tier="free", gpus=4)
    high = submit(cast, "bob", gpus=4)
    result = dispatch_once()
    assert result.placed == [str(high.id)]
    low.refresh_from_db()
    assert low.state == "queued"
    assert low.reason.startswith("first in line: h1 held for it")  # the node is reserved for it


def test_a_job_that_fits_nowhere_waits_with_a_reason(cast):
    make_node("a1", sku="A100-40GB", gpus=2)
    make_node("h1", gpus=2)
    job = submit(cast, gpus=4)
    dispatch_once()
    job.refresh_from_db()
    assert job.state == "queued"
    assert "4 free H100-80GB" in job.reason


def test_the_database_refuses_a_gpu_allocated_twice(cast):
    make_node("h1", gpus=2)
    first, second = submit(cast), submit(cast)
    gpu = Gpu.objects.get(node__name="h1", index=0)
    node = Node.objects.get(name="h1")
    member = services.MemberPlacement(node_id=node.pk, gpu_ids=[gpu.pk], gpu_indices=[0])
    assert services.job_place(job=first, members=[member]) is not None
    with pytest.raises(IntegrityError):
        services.job_place(job=second, members=[member])


def test_a_stale_transition_changes_nothing(cast):
    job = submit(cast)
    stale = Job.objects.get(pk=job.pk)
    assert services.transition_job(job, to="cancelled", expect=["queued"], actor="test")
    assert not services.transition_job(stale, to="starting", expect=["queued"], actor="test")
    job.refresh_from_db()
    assert job.state == "cancelled"


def test_a_gang_is_placed_across_nodes_all_or_nothing(cast):
    make_node("h1", gpus=4, labels={"rack": "r1"})
    make_node("h2", gpus=4, labels={"rack": "r1"})
    too_big = submit(cast, gpus=4, nodes=3)
    gang = submit(cast, gpus=4, nodes=2)
    dispatch_once()
    too_big.refresh_from_db()
    gang.refresh_from_db()
    assert too_big.state == "queued" and not JobAttempt.objects.filter(job=too_big).exists()
    assert gang.state == "starting"
    members = list(
        gang.attempts.get().members.order_by("rank").values_list("node__name", flat=True)
    )
    assert sorted(members) == ["h1", "h2"]
    assert GpuAllocation.objects.filter(released_at=None).count() == 8


def test_an_unhealthy_gpu_is_never_used(cast):
    make_node("h1", gpus=2)
    Gpu.objects.filter(node__name="h1", index=0).update(health="unhealthy")
    job = submit(cast, gpus=1)
    dispatch_once()
    assert job.attempts.get().members.get().gpu_indices == [1]
    assert submit(cast, gpus=1) and dispatch_once().placed == []


def test_a_silent_node_is_lost_and_its_job_requeued(cast):
    node = make_node("h1", gpus=2)
    job = submit(cast, gpus=2)
    dispatch_once()
    Node.objects.filter(pk=node.pk).update(last_heartbeat_at=timezone.now() - timedelta(minutes=5))
    assert mark_silent_nodes_lost() == ["h1"]
    job.refresh_from_db()
    assert job.state == "queued"
    assert job.attempts.get().state == "lost"
    assert not GpuAllocation.objects.filter(released_at=None).exists()


def test_a_cancelled_running_job_keeps_its_gpus_until_the_agent_reports(cast):
    make_node("h1", gpus=1)
    job, attempt = placed_and_started(cast)
    services.job_cancel(job=job, actor="test")
    assert GpuAllocation.objects.filter(released_at=None).count() == 1  # the process may still run
    services.attempt_member_finished(
        attempt_id=attempt.pk, rank=0, token=str(attempt.token), exit_code=-15, reason="cancel"
    )
    attempt.refresh_from_db()
    assert attempt.state == "cancelled"
    assert not GpuAllocation.objects.filter(released_at=None).exists()


def test_a_report_with_a_stale_token_changes_nothing(cast):
    make_node("h1", gpus=1)
    job = submit(cast, gpus=1)
    dispatch_once()
    attempt = job.attempts.get()
    assert not services.attempt_member_finished(
        attempt_id=attempt.pk, rank=0, token="0" * 32, exit_code=0
    )
    job.refresh_from_db()
    assert job.state == "starting"


def test_a_preempted_job_returns_to_the_queue_and_is_placed_again(cast):
    make_node("h1", gpus=2)
    job, attempt = placed_and_started(cast, gpus=2)
    token = str(attempt.token)
    services.job_preempt(job=job, actor="test", reason="room for an enterprise job")
    job.refresh_from_db()
    assert job.state == "preempting"
    services.attempt_member_finished(attempt_id=attempt.pk, rank=0, token=token, exit_code=0, reason="preempt",
                                     checkpoint="/ckpt/step-7.json")  # fmt: skip
    attempt.refresh_from_db()
    job.refresh_from_db()
    assert (attempt.state, attempt.checkpoint) == ("preempted", "/ckpt/step-7.json")
    assert (job.state, job.preemption_count) == ("queued", 1)
    assert "/ckpt/step-7.json" in job.reason
    assert not GpuAllocation.objects.filter(released_at=None).exists()
    assert dispatch_once().placed == [str(job.id)]
    assert job.attempts.count() == 2


def test_only_a_placed_job_can_be_preempted(cast):
    job = submit(cast)
    with pytest.raises(services.ServiceError):
        services.job_preempt(job=job, actor="test", reason="x")


@pytest.fixture
def free_tenant(cast):
    """erin of the free tenant "hobby", whose jobs may be preempted at once, and a 4-GPU node."""
    from apps.tenants.services import tenant_create, user_create

    Tier.objects.filter(name="free").update(min_runtime_seconds=0)
    make_node("h1", gpus=4)
    tenant_create(slug="hobby", tier_name="free")
    cast["erin"] = user_create(username="erin", tenant_slug="hobby")
    return cast


def test_an_enterprise_job_preempts_the_cheapest_free_job(free_tenant):
    cast = free_tenant
    fresh, stale = submit(cast, "erin", gpus=2), submit(cast, "erin", gpus=2)
    dispatch_once()
    for job in (fresh, stale):
        attempt = job.attempts.get()
        services.attempt_member_started(
            attempt_id=attempt.pk, rank=0, token=str(attempt.token), pid=1
        )
    # `fresh` saved a checkpoint just now; `stale` has saved nothing since it started.
    JobAttempt.objects.filter(job=fresh).update(checkpoint="/c", checkpoint_at=timezone.now())
    JobAttempt.objects.filter(job=stale).update(started_at=timezone.now() - timedelta(minutes=5))
    JobAttempt.objects.filter(job=fresh).update(started_at=timezone.now() - timedelta(minutes=5))
    urgent = submit(cast, "bob", gpus=2)
    result = dispatch_once()
    assert result.preempted == [str(fresh.id)]  # losing nothing since its checkpoint is cheapest
    urgent.refresh_from_db()
    assert urgent.state == "queued" and "preempted" in urgent.reason
    fresh.refresh_from_db()
    assert fresh.state == "preempting"
    assert dispatch_once().preempted == []  # no preemption loop while the victim stops


def test_an_enterprise_job_never_preempts_when_it_still_would_not_fit(free_tenant):
    cast = free_tenant
    victim = submit(cast, "erin", gpus=2)
    dispatch_once()
    huge = submit(cast, "bob", gpus=8)
    assert dispatch_once().preempted == []
    victim.refresh_from_db()
    huge.refresh_from_db()
    assert victim.state == "starting" and huge.state == "queued"


def test_preemption_waits_for_a_node_the_autoscaler_is_bringing(free_tenant):
    from apps.nodes.models import GpuSku
    from apps.scheduling.models import ProvisionRequest

    cast = free_tenant
    Tier.objects.filter(name="enterprise").update(preempt_wait_seconds=600)
    victim = submit(cast, "erin", gpus=4)
    dispatch_once()
    ProvisionRequest.objects.create(sku=GpuSku.objects.get(name="H100-80GB"), node_name="auto-1", provider="local",
                                    gpus=4, ready_at=timezone.now() + timedelta(minutes=5))  # fmt: skip
    urgent = submit(cast, "bob", gpus=4)
    assert dispatch_once().preempted == []  # a fitting node arrives within 10 minutes: wait
    Tier.objects.filter(name="enterprise").update(preempt_wait_seconds=60)
    assert dispatch_once().preempted == [str(victim.id)]  # 5 minutes is beyond a 1-minute tolerance
    urgent.refresh_from_db()
    assert urgent.state == "queued"
