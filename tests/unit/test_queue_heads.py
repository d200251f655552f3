"""The dispatcher over long queues (issue 18), against the real database: one pool's backlog
never idles another, every queued job reaches the policy once it heads its queue, and reasons
are written only when they change."""

import secrets
from datetime import timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from apps.jobs import services
from apps.jobs.models import AttemptMember, Job, JobAttempt, JobTemplate
from apps.nodes.models import GpuSku
from apps.scheduling import dispatcher
from apps.scheduling.dispatcher import dispatch_once, ordered_queue, queue_position, queue_positions
from apps.tenants.models import Tenant, Tier
from tests.factories import bulk_queued_jobs, make_cast, make_node
from tests.unit.test_dispatcher import submit


@pytest.fixture
def cast(db):
    return make_cast()


def started(job: Job) -> None:
    attempt = job.attempts.get()
    services.attempt_member_started(attempt_id=attempt.pk, rank=0, token=str(attempt.token), pid=1)


def test_a_job_for_an_idle_sku_starts_behind_50_blocked_jobs_for_a_busy_one(cast):
    make_node("h1", sku="H100-80GB", gpus=8)
    make_node("a1", sku="A100-40GB", gpus=8)
    busy = submit(cast, "bob", gpus=8)  # enterprise, on the only H100 node
    assert dispatch_once().placed == [str(busy.id)]
    blocked = [submit(cast, "bob", gpus=4) for _ in range(50)]
    other = submit(cast, "dave", gpus=2, sku="A100-40GB")  # pro, for the idle A100 node
    result = dispatch_once()
    assert result.placed == [str(other.id)]
    first = Job.objects.get(pk=blocked[0].pk)
    assert first.reason.startswith("first in line: h1 held for it")
    assert Job.objects.filter(pk__in=[j.pk for j in blocked], state="queued").count() == 50


def bulk_queue(cast, count: int, *, user: str = "dave", tier: str = "free") -> None:
    """`count` one-GPU queued jobs for H100 (as many submits would leave them)."""
    person = cast[user][0]
    bulk_queued_jobs(
        count, tenant=Tenant.objects.get(pk=person.membership.tenant_id), user=person,
        tier=Tier.objects.get(name=tier), template=JobTemplate.objects.get(name="demo-train"),
        params={"steps": 1}, gpus=1, gpu_sku=GpuSku.objects.get_or_create(name="H100-80GB")[0],
        max_runtime_seconds=3600,
    )  # fmt: skip


def test_an_enterprise_job_behind_50000_free_jobs_preempts_in_the_first_pass(cast):
    Tier.objects.filter(name="free").update(min_runtime_seconds=0)
    for n in range(2):
        make_node(f"h{n}", gpus=8)
    running = [submit(cast, "dave", tier="free", gpus=8) for _ in range(2)]
    assert len(dispatch_once().placed) == 2
    for job in running:
        started(job)
    JobAttempt.objects.update(started_at=timezone.now() - timedelta(hours=1))
    bulk_queue(cast, 50_000)
    urgent = submit(cast, "bob", gpus=8)  # enterprise, the newest job of 50,001
    assert Job.objects.filter(state="queued").count() == 50_001
    result = dispatch_once()
    assert len(result.preempted) == 1 and result.preempted[0] in {str(j.id) for j in running}
    urgent.refresh_from_db()
    assert urgent.state == "queued" and "preempted" in urgent.reason
    # How long that pass takes is bench.queue_scale's figure (docs/bench/50-queue-scale.md), not a test's.


def test_the_policy_is_handed_the_heads_of_each_queue_not_the_oldest_rows(cast):
    make_node("h1", gpus=1)
    assert dispatcher.QUEUE_HEADS == 256  # the policy's backfill_depth; 3 here
    bulk_queue(cast, 10)  # globex (pro tenant) in tier free: one queue
    late = [submit(cast, "bob"), submit(cast, "bob", sku="A100-40GB"), submit(cast, "dave")]
    heads = list(ordered_queue(heads=3))
    names = [job.name for job in heads]
    assert names[:3] == ["bulk0", "bulk1", "bulk2"]  # the free queue's first three, in order
    assert {j.pk for j in late} <= {j.pk for j in heads}  # each other queue's head is there
    assert len(heads) == 6
    Job.objects.filter(name="bulk9").update(priority_boost=2)
    assert "bulk9" in [job.name for job in ordered_queue(heads=3)]  # boosted: submit is earlier


def numbered_heads(heads: int) -> set:
    """The ids of the heads as the window numbers them (SQLite's read)."""
    now = connection.ops.adapt_datetimefield_value(timezone.now())
    sql, params = dispatcher._numbered_heads(heads, now)
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        return {Job._meta.pk.to_python(row[0]) for row in cursor.fetchall()}


@pytest.mark.skipif(
    connection.vendor != "postgresql", reason="the index's read of the heads is PostgreSQL's"
)
def test_the_heads_read_through_the_index_are_the_heads_the_window_numbers(cast):
    """PostgreSQL reads the heads through the queue's index (a skip from one queue's key to the
    next, then each queue's first jobs); the window numbers every queued row. Same jobs, over
    queues that differ in each part of the key, a missing SKU, ties on the submit time, and the
    jobs that may not start (held, backing off, still stopping) or jump the line (boosted), and
    the widest node selector a submit takes."""
    now = timezone.now()
    jobs = [submit(cast, user, tier=tier, sku=sku, selector=selector)
            for user in ("bob", "dave") for tier in ("pro", "free") for sku in ("H100-80GB", "A100-40GB")
            for selector in ({}, {"rack": "r1"}) for _ in range(4)]  # fmt: skip
    Job.objects.filter(pk__in=[j.pk for j in jobs[::5]]).update(command=["true"])
    Job.objects.filter(pk__in=[j.pk for j in jobs[1::7]]).update(gpu_sku=None)
    Job.objects.filter(pk__in=[j.pk for j in jobs[8:12]]).update(created_at=now)  # ties: by id
    Job.objects.filter(pk__in=[j.pk for j in jobs[3::9]]).update(held_by_dependencies=True)
    backing_off = now + timedelta(hours=1)
    Job.objects.filter(pk__in=[j.pk for j in jobs[4::11]]).update(not_before=backing_off)
    boosted = jobs[-3:]
    Job.objects.filter(pk__in=[j.pk for j in boosted]).update(priority_boost=1)
    # The largest selector a submit takes (32 labels of 63 + 63 characters, which compress
    # poorly): larger than a B-tree entry may be, so the index keys a selector by its hash.
    widest = {secrets.token_urlsafe(48)[:63]: secrets.token_urlsafe(48)[:63] for _ in range(32)}
    wide = [submit(cast, "dave", tier="free", selector=widest) for _ in range(2)]
    make_node("h1", gpus=8)
    stopping = submit(cast, "bob")
    dispatch_once()  # places `stopping`, whose member then keeps running as its job is requeued
    assert AttemptMember.objects.filter(attempt__job=stopping, ended_at=None).exists()
    Job.objects.filter(pk=stopping.pk).update(state="queued")
    for heads in (1, 2, 3):
        through_index = {j.pk for j in ordered_queue(heads=heads)}
        assert through_index == numbered_heads(heads)
        assert stopping.pk not in through_index
        assert {j.pk for j in boosted} <= through_index
        assert wide[0].pk in through_index  # the head of its own queue
    assert len({j.pk for j in ordered_queue(heads=1)}) > 16  # more queues than tiers x tenants


def test_reasons_are_written_once_in_a_batch_and_not_again_unchanged(cast):
    make_node("h1", gpus=2)
    jobs = [submit(cast, "dave", tier="free", gpus=2) for _ in range(6)]
    with CaptureQueriesContext(connection) as first:
        dispatch_once()
    updates = [q["sql"] for q in first.captured_queries if q["sql"].startswith('UPDATE "jobs_job"')]
    reasons = [q for q in updates if 'SET "reason" =' in q]
    assert len(reasons) == 1  # every waiting job's reason in one statement
    assert all(Job.objects.get(pk=j.pk).reason for j in jobs[1:])
    with CaptureQueriesContext(connection) as second:
        dispatch_once()
    assert not [q for q in second.captured_queries if q["sql"].startswith('UPDATE "jobs_job"')]


def test_a_reservations_reason_does_not_move_with_the_insert_time_of_the_job_ahead(cast):
    """The job placed ahead ends, in the pass that placed it, at the pass's clock plus its limit,
    and in the next pass (read back from its attempt's row) at the row's insert time plus its
    limit, a little later (by up to a second on a loaded machine). The reservation's reason is to
    the minute, so it is not rewritten for that."""
    make_node("h1", gpus=2)
    jobs = [submit(cast, "dave", tier="free", gpus=2) for _ in range(3)]
    dispatch_once()
    ahead = JobAttempt.objects.get()
    reason = Job.objects.get(pk=jobs[1].pk).reason
    assert reason.startswith("first in line: h1 held for it from"), reason
    assert reason.count("first in line") == 1, reason  # said once, as a make-run user read it twice
    inserted = ahead.created_at
    later = timedelta(seconds=-1 if inserted.second >= 58 else 1)  # another second, the same minute
    JobAttempt.objects.filter(pk=ahead.pk).update(created_at=inserted + later)
    with CaptureQueriesContext(connection) as second:
        dispatch_once()
    assert Job.objects.get(pk=jobs[1].pk).reason == reason
    assert not [q for q in second.captured_queries if q["sql"].startswith('UPDATE "jobs_job"')]


def test_a_page_of_jobs_counts_its_positions_in_one_query(cast):
    jobs = [submit(cast, "dave", tier="free"), submit(cast, "bob"), submit(cast, "dave")]
    with CaptureQueriesContext(connection) as counted:
        positions = queue_positions(jobs)
    assert len(counted.captured_queries) == 1
    assert positions == {job.pk: queue_position(job) for job in jobs}
    assert sorted(positions.values()) == [1, 2, 3]


def test_kept_heads_are_built_again_only_when_new_or_changed_and_their_tenants_are_fresh(
    cast, monkeypatch
):
    """`ordered_queue(kept_heads=...)`: a head whose row has not changed is the kept instance;
    one whose reason, boost, hold, state or version moved is read again; a tenant's settings are
    read every time (allow_commands decides where a command may run)."""
    jobs = [submit(cast) for _ in range(5)]
    first = ordered_queue(kept_heads={})
    kept = {job.pk: job for job in first}
    built = []
    real = Job.from_db

    def from_db(cls, db, names, values):
        built.append(values[names.index("id")])
        return real(db, names, values)

    monkeypatch.setattr(Job, "from_db", classmethod(from_db))
    again = ordered_queue(kept_heads=kept)
    assert built == [] and [id(job) for job in again] == [id(job) for job in first]
    Job.objects.filter(pk=jobs[1].pk).update(priority_boost=3600)  # the boost service's update
    Job.objects.filter(pk=jobs[3].pk).update(reason="waiting: a dependency")
    Tenant.objects.filter(pk=jobs[0].tenant_id).update(allow_commands=False)
    third = ordered_queue(kept_heads={job.pk: job for job in again})
    assert len(built) == 2
    by_id = {job.pk: job for job in third}
    assert by_id[jobs[1].pk].priority_boost == 3600 and by_id[jobs[1].pk] is not kept[jobs[1].pk]
    assert by_id[jobs[3].pk].reason == "waiting: a dependency"
    assert by_id[jobs[2].pk] is kept[jobs[2].pk]
    assert all(job.tenant.allow_commands is False for job in third)
    assert [job.pk for job in third] == [job.pk for job in ordered_queue()]  # the same order
    services.job_cancel(job=jobs[4], actor="test")
    assert jobs[4].pk not in {job.pk for job in ordered_queue(kept_heads=by_id)}
