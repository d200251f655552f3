"""The dispatcher's per-pass reads written once (apps/scheduling/reads.py) give what the ORM's
queries they replaced gave, row for row and in the same order, and are prepared on PostgreSQL."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.db import connection
from django.db.models import Q
from django.utils import timezone

from apps.jobs import services
from apps.jobs.models import GpuAllocation, Job, JobAttempt, JobTemplate
from apps.nodes.models import GpuSku, Node, NodeState
from apps.scheduling import reads
from apps.scheduling.dispatcher import dispatch_once
from apps.tenants.models import Tenant, Tier
from tests.factories import make_cast, make_node
from tests.unit.test_dispatcher import submit


@pytest.fixture
def cast(db):
    return make_cast()


def fields(instance) -> dict:
    return {f.attname: getattr(instance, f.attname) for f in type(instance)._meta.concrete_fields}


@pytest.fixture
def busy(cast):
    """Nodes of two SKUs (one with labels, one lost), jobs with and without a SKU, a selector
    and a command, running, ended and still queued."""
    make_node("h1", gpus=4, labels={"zone": "a"})
    make_node("h2", sku="A100-40GB", gpus=2)
    lost = make_node("h3", gpus=2)
    Node.objects.filter(pk=lost.pk).update(state=NodeState.LOST)
    jobs = [submit(cast, gpus=1) for _ in range(3)]
    jobs += [submit(cast, "dave", sku="A100-40GB", gpus=2), submit(cast, selector={"zone": "a"})]
    Job.objects.filter(pk=jobs[1].pk).update(gpu_sku=None, command=["true"])
    assert len(dispatch_once().placed) == 5
    for job in jobs[:4]:
        attempt = job.attempts.get()
        services.attempt_member_started(attempt_id=attempt.pk, rank=0, token=str(attempt.token),
                                        pid=1)  # fmt: skip
    for job in jobs[:2]:
        attempt = job.attempts.get()
        services.attempt_member_finished(attempt_id=attempt.pk, rank=0, token=str(attempt.token),
                                         exit_code=0, reason="done")  # fmt: skip
    submit(cast, gpus=4)  # queued
    return jobs


def test_the_tiers_are_the_orms(busy):
    assert [fields(t) for t in reads.tier_rows()] == [fields(t) for t in Tier.objects.all()]


def test_the_nodes_and_allocations_are_the_orms(busy):
    orm_nodes = Node.objects.exclude(state__in=[NodeState.LOST, NodeState.TERMINATED])
    assert reads.node_rows() == list(orm_nodes.values_list(*reads.NODE_FIELDS))
    assert any(row[3] == {"zone": "a"} for row in reads.node_rows())  # the labels decoded
    orm_allocations = GpuAllocation.objects.filter(released_at=None)
    assert sorted(reads.allocation_rows()) == sorted(
        orm_allocations.values_list(*reads.ALLOCATION_FIELDS)
    )
    assert len(reads.allocation_rows()) == 4  # 1 + 2 + 1: two one-GPU jobs ended


def test_the_attempts_are_the_orms_in_the_orms_order(busy):
    every = list(JobAttempt.objects.values_list("pk", flat=True))
    some = every[1:4]
    assert reads.attempt_rows(some) == list(
        JobAttempt.objects.filter(pk__in=some).values_list(*reads.ATTEMPT_FIELDS)
    )
    held = GpuAllocation.objects.filter(released_at=None).values("attempt_id")
    assert reads.attempt_rows(None) == list(
        JobAttempt.objects.filter(pk__in=held).values_list(*reads.ATTEMPT_FIELDS)
    )
    assert reads.attempt_rows([]) == []


def test_the_usage_spans_are_the_orms(busy):
    rows = JobAttempt.objects.filter(started_at__isnull=False).order_by()  # what UsageSpans read
    since = timezone.now() - timedelta(hours=1)
    assert sorted(reads.span_rows(since=since)) == sorted(
        rows.filter(Q(ended_at__isnull=True) | Q(ended_at__gte=since)).values_list(*reads.SPAN_FIELDS)
    )  # fmt: skip
    ended = sorted(rows.exclude(ended_at=None).values_list("pk", flat=True))
    running = sorted(rows.filter(ended_at=None).values_list("pk", flat=True))
    assert sorted(reads.live_attempt_ids()) == running
    for known, also in [([], []), (ended[:1], []), (ended, running[:1]), ([], running)]:
        recent = Q(ended_at__gte=since)
        if known:
            recent &= ~Q(pk__in=known)
        expected = rows.filter(recent | Q(pk__in=also) if also else recent)
        got = reads.span_rows(ended_after=since, known=known, also=also)
        assert sorted(got) == sorted(expected.values_list(*reads.SPAN_FIELDS)), (known, also)


def test_the_heads_related_rows_are_the_orms(busy):
    for model in (Tenant, GpuSku, JobTemplate):
        ids = set(model.objects.values_list("pk", flat=True))
        got = reads.rows_by_id(model, ids)
        assert {k: fields(v) for k, v in got.items()} == {
            k: fields(v) for k, v in model.objects.in_bulk(ids).items()
        }
        assert reads.rows_by_id(model, set()) == {}


def test_a_pass_builds_no_orm_statement_for_these_reads(busy, monkeypatch):
    """A drain's pass: none of the tiers, nodes, allocations, attempts, spans or the heads'
    tenants and SKUs go through the ORM's compiler."""
    from django.db.models.sql import compiler

    built = []
    real = compiler.SQLCompiler.as_sql

    def as_sql(self, *args, **kwargs):
        built.append(self.query.model._meta.db_table if self.query.model else "?")
        return real(self, *args, **kwargs)

    monkeypatch.setattr(compiler.SQLCompiler, "as_sql", as_sql)
    dispatch_once()
    for table in ("tenants_tier", "nodes_node", "jobs_gpuallocation", "tenants_tenant",
                  "nodes_gpusku", "jobs_jobtemplate"):  # fmt: skip
        assert table not in built, built
    assert built.count("jobs_jobattempt") == 0, built


@pytest.mark.skipif(
    "connection.vendor != 'postgresql'", reason="prepared statements are PostgreSQL's"
)
def test_the_reads_are_prepared_on_postgresql(busy):
    """Their text is the same every pass (ids travel as one array): psycopg prepares them on
    their 6th run and the server stops parsing and planning them."""
    some = list(JobAttempt.objects.values_list("pk", flat=True))
    since = timezone.now() - timedelta(hours=1)
    from apps.jobs.placement import _claim_queued

    queued = list(Job.objects.filter(state="queued"))
    for i in range(6):
        _claim_queued(queued)
        reads.tier_rows(), reads.node_rows(), reads.allocation_rows(), reads.live_attempt_ids()
        reads.attempt_rows(some[: i + 1])
        reads.span_rows(ended_after=since, known=some[:i], also=some[i:])
        reads.rows_by_id(Tenant, {i + 1})
    with connection.cursor() as cursor:
        cursor.execute("SELECT statement FROM pg_prepared_statements")
        statements = [statement for (statement,) in cursor.fetchall()]
    for table in (
        '"tenants_tier" r',
        '"nodes_node" n',
        '"jobs_gpuallocation" g',
        '"tenants_tenant" x',
    ):
        assert any(table in s for s in statements), (table, statements)
    assert any("SKIP LOCKED" in s for s in statements), statements  # the claim
    assert sum('FROM "jobs_jobattempt" a' in s for s in statements) >= 3, statements


def test_the_claim_is_the_orms(cast, busy):
    """`_claim_queued` (apps/jobs/placement.py): the queued jobs still at the version read, as
    the ORM's locking read found them; a job read at an older version or placed is not claimed."""
    from django.db import transaction

    from apps.jobs.placement import _claim_queued
    from apps.jobs.states import job_sources

    jobs = list(Job.objects.all())
    queued = [job for job in jobs if job.state == "queued"]
    extra = submit(cast, gpus=1)
    stale = Job.objects.get(pk=extra.pk)
    stale.version -= 1
    jobs += [stale]
    with transaction.atomic():
        rows = (
            Job.objects.select_for_update(skip_locked=True)
            .filter(pk__in={job.pk for job in jobs}, state__in=job_sources("starting"))
            .values_list("pk", "version")
        )
        expected = {job.pk: job.version for job in jobs}
        orm = {pk for pk, version in rows if expected[pk] == version}
        assert _claim_queued(jobs) == orm == {job.pk for job in queued}


def test_the_heads_read_again_are_the_orms(busy):
    """The heads new or changed since the last pass, read whole by id."""
    ids = list(Job.objects.values_list("pk", flat=True))
    orm = {job.pk: fields(job) for job in Job.objects.filter(pk__in=ids)}
    assert {pk: fields(job) for pk, job in reads.jobs_by_id(ids).items()} == orm
    assert {pk: fields(job) for pk, job in reads.jobs_by_id(ids[:1]).items()} == {
        ids[0]: orm[ids[0]]
    }
