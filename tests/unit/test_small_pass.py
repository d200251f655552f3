"""What a small dispatcher pass costs (issue 18, submit-to-running): one job placed on an idle
node, and the pass after each job's end during a drain. Statement ceilings, not timings: each
statement is most of its cost in the ORM's building of it (docs/scheduling.md, "A small pass")."""

import re
from datetime import timedelta

import pytest
from django.db import connection
from django.db.models import QuerySet
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from apps.jobs import services
from apps.jobs.models import AttemptMember, Job
from apps.nodes.models import Gpu, Node
from apps.scheduling import core, dispatcher, kept
from apps.scheduling.dispatcher import dispatch_once
from tests.factories import make_cast, make_node
from tests.unit.test_batch_placement import on_gpu
from tests.unit.test_dispatcher import submit


@pytest.fixture
def cast(db):
    return make_cast()


def started(job: Job, *, finished: bool = False) -> None:
    attempt = job.attempts.get(ended_at=None)
    token = str(attempt.token)
    services.attempt_member_started(attempt_id=attempt.pk, rank=0, token=token, pid=1)
    if finished:
        services.attempt_member_finished(attempt_id=attempt.pk, rank=0, token=token, exit_code=0,
                                         reason="done")  # fmt: skip


def placing_one(cast) -> CaptureQueriesContext:
    """The statements of a pass that places the one job just submitted, on an idle node whose
    state the dispatcher keeps (the latency bench's shape: each job ends before the next)."""
    make_node("h1", gpus=8)
    dispatch_once()  # the kept state is read here
    for _ in range(2):
        job = submit(cast)
        assert dispatch_once().placed == [str(job.pk)]
        started(job, finished=True)
    job = submit(cast)
    with CaptureQueriesContext(connection) as pass_:
        assert dispatch_once().placed == [str(job.pk)]
    return pass_


def test_a_pass_placing_one_job_on_an_idle_node_costs_30_statements_at_most(cast):
    # 37 before the tiers were read once, the window taken from the kept state and the starts
    # left to jobs_place's own transaction (with the test's transaction around, savepoints).
    assert len(placing_one(cast).captured_queries) <= 30


def test_a_pass_reads_the_tiers_once(cast):
    reads = [q for q in placing_one(cast).captured_queries if 'FROM "tenants_tier"' in q["sql"]]
    assert len(reads) == 1  # the policy's tiers, the grace, the heads' tiers, the kept stamp


def test_a_pass_that_keeps_its_state_checks_its_stamps_in_one_statement(cast):
    # The GPUs' count and unhealthy ones, the tenants that allow commands, the held allocations,
    # the running attempts (the usage's stamp) and the checkpoints saved since the last pass
    # were six statements (six round trips: on PostgreSQL each waits for the
    # server's process, docs/bench/71-slurm-peer-notes.md, "h36start pass").
    queries = [q["sql"] for q in placing_one(cast).captured_queries]
    stamps = [
        sql
        for sql in queries
        if re.search(r'nodes_gpu\b|WHERE allow_commands|MAX\(started_at\)|checkpoint_at"? >=', sql)
    ]
    assert len(stamps) == 1
    assert "jobs_gpuallocation" in stamps[0] and "allow_commands" in stamps[0]


def test_a_pass_that_only_starts_opens_no_transaction_around_jobs_place(cast):
    savepoints = [q for q in placing_one(cast).captured_queries if q["sql"].startswith("SAVEPOINT")]
    # The batch's own transaction (a savepoint here, inside the test's): no transaction of
    # jobs_place's around it, which made the batch's a savepoint in production too.
    assert len(savepoints) == 1


def test_a_pass_per_job_end_during_a_drain_costs_35_statements_at_most(cast):
    for name in ("d0", "d1"):
        make_node(name, gpus=4)
    queued = [submit(cast) for _ in range(24)]
    assert len(dispatch_once().placed) == 8
    running = [job for job in queued if Job.objects.get(pk=job.pk).state == "starting"]
    for job in running:
        started(job)
    for job in running[:3]:
        attempt = job.attempts.get(ended_at=None)
        services.attempt_member_finished(attempt_id=attempt.pk, rank=0, token=str(attempt.token),
                                         exit_code=0, reason="done")  # fmt: skip
        with CaptureQueriesContext(connection) as pass_:
            assert len(dispatch_once().placed) == 1
        assert len(pass_.captured_queries) <= 35  # 44-48 before
        for moved in Job.objects.filter(state="starting"):
            started(moved)


def test_the_kept_state_counts_the_free_gpus_the_window_counts(cast):
    """The pass takes its window from the kept state (no counts of its own): the same figure
    as the two counts, with GPUs held, unhealthy and on a node that is not ready."""

    def both() -> tuple[int, int]:
        state = kept.KEPT.pass_state(core.FGDPlus())
        kept.KEPT.done(state, [])
        return dispatcher.pass_window(state), dispatcher.pass_window()

    node = make_node("h1", gpus=4)
    other = make_node("h2", gpus=4)
    assert both() == (dispatcher.QUEUE_HEADS + 8,) * 2
    services.job_place(job=submit(cast), members=[on_gpu(node, 1)])
    assert both() == (dispatcher.QUEUE_HEADS + 7,) * 2
    Gpu.objects.filter(node=node, index=0).update(health="unhealthy")
    assert both() == (dispatcher.QUEUE_HEADS + 6,) * 2
    services.job_place(job=submit(cast), members=[on_gpu(other, 2)])
    Node.objects.filter(pk=other.pk).update(state="draining")  # its held GPU still counts
    assert both() == (dispatcher.QUEUE_HEADS + 1,) * 2
    for job in Job.objects.filter(state="starting"):
        started(job, finished=True)
    assert both() == (dispatcher.QUEUE_HEADS + 3,) * 2


def test_the_numbered_heads_are_each_queues_first_jobs_that_may_start(cast):
    """SQLite's read of the heads (`_numbered_heads`, raw SQL) against the rule in Python, over
    queues that differ in each part of the key, ties on the submit time, and the jobs that may
    not start (held, backing off, still stopping) or jump the line (boosted)."""
    now = timezone.now()
    jobs = [submit(cast, user, tier=tier, sku=sku, selector=selector)
            for user in ("bob", "dave") for tier in ("pro", "free") for sku in ("H100-80GB", "A100-40GB")
            for selector in ({}, {"rack": "r1"}) for _ in range(3)]  # fmt: skip
    Job.objects.filter(pk__in=[j.pk for j in jobs[::5]]).update(command=["true"])
    Job.objects.filter(pk__in=[j.pk for j in jobs[1::7]]).update(gpu_sku=None)
    Job.objects.filter(pk__in=[j.pk for j in jobs[8:12]]).update(created_at=now)  # ties: by id
    Job.objects.filter(pk__in=[j.pk for j in jobs[3::9]]).update(held_by_dependencies=True)
    Job.objects.filter(pk__in=[j.pk for j in jobs[4::11]]).update(
        not_before=now + timedelta(hours=1)
    )
    Job.objects.filter(pk__in=[j.pk for j in jobs[-3:]]).update(priority_boost=1)
    make_node("h1", gpus=8)
    stopping = submit(cast, "bob")
    dispatch_once()  # places `stopping`, whose member then keeps running as its job is requeued
    assert AttemptMember.objects.filter(attempt__job=stopping, ended_at=None).exists()
    Job.objects.filter(pk=stopping.pk).update(state="queued")

    def expected(heads: int) -> set:
        moment = timezone.now()
        stopping_jobs = set(
            AttemptMember.objects.filter(ended_at=None).values_list("attempt__job_id", flat=True)
        )
        queues: dict[tuple, list[Job]] = {}
        boosted = set()
        for job in Job.objects.filter(state="queued"):
            if job.held_by_dependencies or job.pk in stopping_jobs:
                continue
            if job.not_before is not None and job.not_before > moment:
                continue
            key = (job.tier_id, job.tenant_id, job.gpu_sku_id, str(job.node_selector),
                   job.command is not None)  # fmt: skip
            queues.setdefault(key, []).append(job)
            if job.priority_boost:
                boosted.add(job.pk)
        firsts = {
            job.pk
            for queue in queues.values()
            for job in sorted(queue, key=lambda j: (j.created_at, j.pk.hex))[:heads]
        }
        return firsts | boosted

    for heads in (1, 2, 3):
        now_db = connection.ops.adapt_datetimefield_value(timezone.now())
        sql, params = dispatcher._numbered_heads(heads, now_db)
        with connection.cursor() as cursor:
            cursor.execute(sql, params)
            numbered = {Job._meta.pk.to_python(row[0]) for row in cursor.fetchall()}
        assert numbered == expected(heads)
        assert stopping.pk not in numbered
        assert {job.pk for job in dispatcher.ordered_queue(heads=heads)} == numbered


def test_checking_the_kept_state_builds_no_orm_aggregate(cast, monkeypatch):
    """The stamps a pass checks (GPUs, held allocations, tenants allowed commands, running
    attempts) are SQL written once: the ORM built each anew every pass, most of its cost."""
    make_node("h1", gpus=8)
    job = submit(cast)
    dispatch_once()
    started(job)

    def built(*args, **kwargs):
        raise AssertionError("an ORM aggregate built in the kept state's check")

    rebuilds = kept.KEPT.rebuilds
    monkeypatch.setattr(QuerySet, "aggregate", built)
    state = kept.KEPT.pass_state(core.FGDPlus())
    try:
        assert kept.KEPT.rebuilds == rebuilds  # brought up to date, not read again
        kept.KEPT.usage(state, timezone.now(), 3600.0)
    finally:
        kept.KEPT.done(state, [])


def test_a_pass_with_no_node_on_its_way_reads_no_provision_request(cast):
    reads = [q["sql"] for q in placing_one(cast).captured_queries if "provisionrequest" in q["sql"]]
    assert len(reads) == 1 and reads[0].startswith("SELECT 1 FROM")  # the probe, no rows read
