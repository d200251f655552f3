"""A pass's starts placed together (apps.jobs.services.jobs_place): each start still guarded
by its job's state and version and by the allocation index, in a fixed number of statements."""

from datetime import timedelta

import pytest
from django.db import connection
from django.db.models import F
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from apps.jobs import services
from apps.jobs.models import AttemptMember, GpuAllocation, Job, JobAttempt, JobEvent
from apps.nodes.models import Gpu, Node
from apps.scheduling import dispatcher
from apps.scheduling.dispatcher import dispatch_once
from tests.factories import make_cast, make_node
from tests.unit.test_dispatcher import submit


@pytest.fixture
def cast(db):
    return make_cast()


def on_gpu(node: Node, index: int) -> services.MemberPlacement:
    gpu = Gpu.objects.get(node=node, index=index)
    return services.MemberPlacement(node_id=node.pk, gpu_ids=[gpu.pk], gpu_indices=[index])


def batch(jobs, node: Node) -> list[services.JobPlacement]:
    return [
        services.JobPlacement(job=job, members=[on_gpu(node, i)], why="test")
        for i, job in enumerate(jobs)
    ]


def test_a_job_cancelled_meanwhile_is_left_out_and_the_others_are_placed(cast):
    node = make_node("h1", gpus=4)
    jobs = [submit(cast) for _ in range(4)]
    services.job_cancel(job=Job.objects.get(pk=jobs[1].pk), actor="user:bob")
    Job.objects.filter(pk=jobs[2].pk).update(version=F("version") + 1)  # changed, still queued
    placed = services.jobs_place(batch(jobs, node))
    assert set(placed) == {jobs[0].pk, jobs[3].pk}
    assert Job.objects.get(pk=jobs[1].pk).state == "cancelled"
    assert Job.objects.get(pk=jobs[2].pk).state == "queued"
    assert not JobAttempt.objects.filter(job__in=[jobs[1], jobs[2]]).exists()
    held = GpuAllocation.objects.filter(released_at=None).values_list("gpu__index", flat=True)
    assert sorted(held) == [0, 3]
    assert jobs[1].state == jobs[2].state == "queued"  # the losers in memory: as read


def test_a_gpu_taken_by_another_dispatcher_refuses_only_its_job(cast):
    node = make_node("h1", gpus=4)
    jobs = [submit(cast) for _ in range(3)]
    other = submit(cast)
    assert services.job_place(job=other, members=[on_gpu(node, 1)]) is not None  # first
    placed = services.jobs_place(batch(jobs, node))
    assert set(placed) == {jobs[0].pk, jobs[2].pk}
    loser = Job.objects.get(pk=jobs[1].pk)
    assert loser.state == "queued" and loser.version == jobs[1].version
    assert jobs[1].state == "queued" and not JobAttempt.objects.filter(job=loser).exists()
    assert GpuAllocation.objects.get(gpu__index=1, released_at=None).attempt.job_id == other.pk
    assert {j.pk for j in jobs if j.state == "starting"} == set(placed)


def written(job: Job) -> dict:
    """What a placement wrote for `job`, less ids and times."""
    job = Job.objects.get(pk=job.pk)
    attempt = job.attempts.get()
    return {
        "job": (job.state, job.version, job.attempts_count, job.reason),
        "attempt": (attempt.number, attempt.state, attempt.version, attempt.stop_requested),
        "lease": round((attempt.lease_expires_at - timezone.now()) / timedelta(minutes=1)),
        "members": list(attempt.members.values_list("rank", "node__name", "gpu_indices", "state")),
        "gpus": list(attempt.allocations.values_list("gpu__node__name", "gpu__index")),
        "events": list(
            JobEvent.objects.filter(job=job, attempt=attempt).values_list(
                "kind", "from_state", "to_state", "actor", "reason", "data"
            )
        ),
    }  # fmt: skip


def test_a_batch_writes_for_each_job_what_job_place_writes(cast):
    node = make_node("h1", gpus=2)
    alone, batched = submit(cast), submit(cast)
    gang_node = make_node("h2", gpus=2)
    members = [on_gpu(node, 0), on_gpu(gang_node, 0)]
    attempt = services.job_place(job=alone, members=members, why="test")
    GpuAllocation.objects.filter(attempt=attempt).update(released_at=timezone.now())
    placed = services.jobs_place([services.JobPlacement(job=batched, members=members, why="test")])
    assert written(batched) == written(alone)
    assert written(batched)["events"] == [
        ("state", "queued", "starting", "system:dispatcher", "placed on h1:[0], h2:[0] (test)", {})
    ]
    assert (batched.state, batched.version) == (alone.state, alone.version) == ("starting", 1)
    assert batched.reason == alone.reason and batched.attempts_count == alone.attempts_count == 1
    assert placed[batched.pk].token != attempt.token  # each attempt its own fencing token
    assert [m.node.name for m in placed[batched.pk].members.all()] == ["h1", "h2"]


def test_a_batch_costs_the_same_statements_for_2_jobs_as_for_40(
    cast, django_assert_max_num_queries
):
    node = make_node("h1", gpus=40)
    few, many = [submit(cast) for _ in range(2)], [submit(cast) for _ in range(40)]
    two_starts = batch(few, node)
    with CaptureQueriesContext(connection) as two:
        assert len(services.jobs_place(two_starts)) == 2
    GpuAllocation.objects.update(released_at=timezone.now())
    forty_starts = batch(many, node)
    with django_assert_max_num_queries(len(two.captured_queries)):
        assert len(services.jobs_place(forty_starts)) == 40
    assert AttemptMember.objects.count() == 42


def test_a_pass_placing_16_jobs_costs_the_statements_of_one_placing_2(cast, monkeypatch):
    monkeypatch.setattr(dispatcher, "SQLITE_WRITE_CHUNK", 64)  # SQLite: one transaction too
    for name in ("h1", "h2"):
        make_node(name, gpus=8)
    for _ in range(2):
        submit(cast)
    with CaptureQueriesContext(connection) as two:
        assert len(dispatch_once().placed) == 2
    GpuAllocation.objects.update(released_at=timezone.now())
    Job.objects.update(state="succeeded")
    JobAttempt.objects.update(state="succeeded", ended_at=timezone.now())
    AttemptMember.objects.update(state="succeeded", ended_at=timezone.now())
    for _ in range(16):
        submit(cast)
    with CaptureQueriesContext(connection) as sixteen:
        assert len(dispatch_once().placed) == 16
    assert len(sixteen.captured_queries) <= len(two.captured_queries)


def test_a_pass_on_an_idle_cluster_starts_more_than_the_window(cast, monkeypatch):
    monkeypatch.setattr(dispatcher, "QUEUE_HEADS", 2)  # the backfill window, 256 in production
    make_node("h1", gpus=8)
    jobs = [submit(cast) for _ in range(6)]  # one queue
    assert dispatcher.pass_window() == 2 + 8
    assert sorted(dispatch_once().placed) == sorted(str(job.pk) for job in jobs)
    assert dispatcher.pass_window() == 2 + 2


def test_the_window_counts_only_usable_free_gpus(cast, monkeypatch):
    monkeypatch.setattr(dispatcher, "QUEUE_HEADS", 2)
    node = make_node("h1", gpus=4)
    make_node("h2", gpus=4)
    Node.objects.filter(name="h2").update(state="draining")
    Gpu.objects.filter(node=node, index=0).update(health="unhealthy")
    services.job_place(job=submit(cast), members=[on_gpu(node, 1)])
    assert dispatcher.pass_window() == 2 + 2
