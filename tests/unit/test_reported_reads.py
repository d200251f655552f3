"""What the report calls read (apps/jobs/services.py `lock_reported_members`, written once instead
of built by the ORM on every call): the same members, attempts, jobs and nodes, field for field,
as the ORM's own read; one attempt object per gang; the node's filter; prepared on PostgreSQL."""

from __future__ import annotations

import re

import pytest
from django.db import connection, transaction

from apps.jobs import services
from apps.jobs.models import AttemptMember, Job, JobAttempt, JobDependency
from apps.nodes.models import Node
from tests.factories import make_node
from tests.unit.test_agent_batches import (  # noqa: F401 (cast: a fixture)
    cast,
    item,
    placed,
    post,
    prepared_after_seven_starts,
)
from tests.unit.test_dispatcher import dispatch_once, submit


def fields(instance) -> dict:
    return {f.attname: getattr(instance, f.attname) for f in type(instance)._meta.concrete_fields}


def as_the_orm_reads(attempt_ids) -> dict:
    rows = AttemptMember.objects.select_related("attempt__job", "node").filter(
        attempt_id__in=attempt_ids
    )
    return {(m.attempt_id, m.rank): m for m in rows}


def test_every_field_read_is_the_orms(cast):  # noqa: F811
    attempts = placed(cast, 2, {"h1": 2})
    JobAttempt.objects.filter(pk=attempts[0].pk).update(
        stop_requested="cancel", checkpoint="checkpoints/x/", master_port=2900
    )
    AttemptMember.objects.filter(attempt=attempts[1]).update(pid=7, state="running")
    ids = [a.pk for a in attempts]
    with transaction.atomic():
        read = services.lock_reported_members(attempt_ids=ids)
    orm = as_the_orm_reads(ids)
    assert read.keys() == orm.keys()
    for key, reported in read.items():
        member, expected = reported.member, orm[key]
        assert fields(member) == fields(expected)
        assert fields(member.attempt) == fields(expected.attempt)
        assert fields(member.attempt.job) == fields(expected.attempt.job)
        assert fields(member.node) == fields(expected.node)
        assert isinstance(member.attempt.job.params, dict)  # a JSON field, decoded
        assert not member.attempt.job.get_deferred_fields()
        assert not member._state.adding and member._state.db == "default"


def test_a_gang_shares_one_attempt_and_the_node_filter_keeps_its_members_only(cast):  # noqa: F811
    make_node("g1", gpus=4)
    make_node("g2", gpus=4)
    gang = submit(cast, gpus=4, nodes=2)
    dispatch_once()
    attempt = JobAttempt.objects.get(job=gang)
    with transaction.atomic():
        everyone = services.lock_reported_members(attempt_ids=[attempt.pk])
        on_g2 = services.lock_reported_members(attempt_ids=[attempt.pk], node_name="g2")
        nobody = services.lock_reported_members(attempt_ids=[attempt.pk], node_name="h9")
    assert sorted(everyone) == [(attempt.pk, 0), (attempt.pk, 1)]
    first, second = everyone[(attempt.pk, 0)], everyone[(attempt.pk, 1)]
    assert first.member.attempt is second.member.attempt
    assert first.gang == second.gang and len(first.gang) == 2
    assert [r.member.node.name for r in on_g2.values()] == ["g2"]
    assert len(next(iter(on_g2.values())).gang) == 2  # its gang still whole
    assert nobody == {}
    assert services.lock_reported_members(attempt_ids=[]) == {}


def test_a_job_changed_by_the_read_objects_saves_as_an_orm_read_one_would(cast):  # noqa: F811
    """The instances are the ORM's kind (Model.from_db): saved, they update their rows."""
    (attempt,) = placed(cast, 1, {"h1": 1})
    with transaction.atomic():
        reported = services.lock_reported_members(attempt_ids=[attempt.pk])[(attempt.pk, 0)]
    job = reported.member.attempt.job
    job.name = "renamed"
    job.save(update_fields=["name"])
    assert Job.objects.get(pk=job.pk).name == "renamed"
    assert Node.objects.filter(name=reported.member.node.name).count() == 1


def test_the_read_says_whether_a_pending_dependency_waits_on_the_job(cast):  # noqa: F811
    """`awaited`: a pending dependency on the job (as a parent) at the read; a decided one, or
    one on another job, does not count. A batch's ends read no dependents for the others."""
    waited, decided, alone = placed(cast, 3, {"h1": 3})
    dependent = submit(cast)
    JobDependency.objects.create(job=dependent, parent_job_id=waited.job_id, condition="afterok")
    JobDependency.objects.create(job=dependent, parent_job_id=decided.job_id, position=1,
                                 condition="afterany", state="satisfied")  # fmt: skip
    ids = [waited.pk, decided.pk, alone.pk]
    with transaction.atomic():
        read = services.lock_reported_members(attempt_ids=ids, node_name="h1")
    assert {a: read[(a, 0)].awaited for a in ids} == {
        waited.pk: True,
        decided.pk: False,
        alone.pk: False,
    }


@pytest.mark.skipif(
    "connection.vendor != 'postgresql'", reason="prepared statements are PostgreSQL's"
)
def test_the_reports_lock_and_read_are_prepared_on_postgresql(cast):  # noqa: F811
    """Their text is the same for any batch (the ids travel as one array): psycopg prepares them
    on their 6th run and the server stops parsing and planning them."""
    statements = prepared_after_seven_starts(cast)
    assert any("FOR UPDATE" in s and '"jobs_job"' in s for s in statements), statements
    assert any('FROM "jobs_attemptmember" m' in s for s in statements), statements


def test_a_groups_rows_are_stored_as_the_orm_stores_them(cast):  # noqa: F811
    """The group's statements are written by hand on both backends (batch_reports._Writes): each
    value goes through its field's own conversion, so a time is stored as the ORM stores one (on
    SQLite naive UTC text) and the rows read back, filter and order like any other."""
    a, b = placed(cast, 2, {"h1": 2})
    post("h1", [item(a, "started", pid=3), item(a, "finished", exit_code=0)])  # one group
    post("h1", [item(b, "started", pid=4)])
    services.attempt_member_finished(attempt_id=b.pk, rank=0, token=str(b.token), exit_code=0)
    with connection.cursor() as cursor:  # b's end went through its service: the ORM's writes
        cursor.execute(
            "SELECT id, CAST(finished_at AS TEXT), CAST(started_at AS TEXT) FROM jobs_job"
        )
        rows = {str(row[0]).replace("-", ""): row[1:] for row in cursor.fetchall()}
        cursor.execute(
            "SELECT job_id, data, created_at FROM jobs_jobevent WHERE actor = 'agent:h1'"
        )
        events = cursor.fetchall()
    stored = r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d(\.\d{1,6})?"
    stored += "$" if connection.vendor == "sqlite" else r"\+00$"
    for times in (rows[a.job_id.hex], rows[b.job_id.hex]):
        assert all(re.match(stored, t) for t in times), times
    assert {str(data) for _, data, _ in events} == {"{}"}
    a_job = Job.objects.get(pk=a.job_id)
    assert Job.objects.filter(pk=a.job_id, finished_at=a_job.finished_at).exists()
    assert a_job.events.filter(actor="agent:h1").count() == 2
    assert [e.data for e in a_job.events.all()] == [{} for _ in a_job.events.all()]
