"""Each tenant's queued-job count, kept by triggers on the jobs table (apps/admission/queued.py),
on the suite's database (SQLite, or PostgreSQL on CI)."""

import pytest
from django.core.management import CommandError, call_command
from django.db import connection
from django.test.utils import CaptureQueriesContext

from apps.admission import queued
from apps.admission.models import QueuedCount
from apps.jobs.models import Job, JobState
from apps.jobs.services import job_cancel, job_requeue
from apps.tenants.models import Tenant
from apps.tenants.services import quota_set
from tests.admission.conftest import TRAIN, generous, placed_ids
from tests.factories import client_for, make_cast, make_node, park_node


@pytest.fixture(autouse=True)
def never_fits_is_parked(request):
    """The 64-GPU jobs here stay queued on a cordoned 64-GPU node (tests.factories.park_node):
    a job no node could ever fit is refused at submit (issue 30)."""
    if {"cast", "as_user"} & set(request.fixturenames):
        request.getfixturevalue("cast")
        park_node()


def kept(slug: str) -> int | None:
    return QueuedCount.objects.filter(tenant__slug=slug).values_list("queued", flat=True).first()


def test_the_count_follows_every_way_a_job_enters_or_leaves_the_queue(as_user, cast):
    bob, dave = as_user("bob"), as_user("dave")
    ids = [bob.post("/api/v1/jobs/", TRAIN, format="json").json()["id"] for _ in range(3)]
    dave.post("/api/v1/jobs/", {**TRAIN, "gpus": 64}, format="json")  # never fits
    assert (kept("acme"), kept("globex")) == (3, 1)
    placed = placed_ids()  # the dispatcher takes jobs out of the queue
    assert len(placed) == 3 and kept("acme") == 0 and kept("globex") == 1
    job_requeue(job=Job.objects.get(pk=ids[0]), actor="staff:test", reason="test")  # back in
    assert kept("acme") == 1
    job_cancel(job=Job.objects.get(pk=ids[0]), actor="user:bob")  # out
    assert kept("acme") == 0
    Job.objects.filter(pk=ids[1]).update(
        state=JobState.QUEUED
    )  # any write at all: the ORM, raw SQL
    globex = Tenant.objects.get(slug="globex")
    Job.objects.filter(pk=ids[1]).update(tenant=globex)  # a queued job moved to another tenant
    assert (kept("acme"), kept("globex")) == (0, 2)
    Job.objects.filter(pk=ids[1]).delete()
    assert (kept("acme"), kept("globex")) == (0, 1)
    assert queued.differences() == {}


def test_install_puts_a_lost_trigger_back_and_counts_the_queue_again(as_user):
    bob = as_user("bob")
    for _ in range(2):
        bob.post("/api/v1/jobs/", {**TRAIN, "gpus": 64}, format="json")
    name = f"{queued.PREFIX}_insert"
    with connection.cursor() as cursor:  # what a table rebuilt by an SQLite migration would leave
        table = connection.ops.quote_name(Job._meta.db_table)
        cursor.execute(
            f"DROP TRIGGER {name}" + (f" ON {table}" if connection.vendor == "postgresql" else "")
        )
    bob.post("/api/v1/jobs/", {**TRAIN, "gpus": 64}, format="json")  # not counted: no trigger
    assert queued.differences() and name not in queued.installed()
    assert queued.install() == [name]
    assert queued.differences() == {} and kept("acme") == 3
    assert queued.install() == []  # nothing missing: nothing done


def test_the_command_checks_and_fixes_the_counts(as_user, capsys):
    as_user("bob").post("/api/v1/jobs/", {**TRAIN, "gpus": 64}, format="json")
    call_command("queued_counts")
    assert "agree" in capsys.readouterr().out
    QueuedCount.objects.filter(tenant__slug="acme").update(queued=7)
    with pytest.raises(CommandError):
        call_command("queued_counts")
    assert "kept 7, counted 1" in capsys.readouterr().out
    call_command("queued_counts", "--fix")
    assert queued.differences() == {} and kept("acme") == 1


@pytest.mark.django_db(transaction=True)
def test_a_submit_outside_a_transaction_checks_the_cap_and_inserts_in_one_statement():
    """As in production (no test transaction around the request). On PostgreSQL the count row's
    lock, then the cap's check (`gpuplatform_queue_room`) and both inserts, are one statement
    (one round trip) with no BEGIN or COMMIT; on SQLite a transaction that reads the kept count.
    Either way the cap holds, and a refusal names the count."""
    people = make_cast()
    make_node("h1", "H100-80GB", 8)
    park_node()
    generous("acme")
    quota_set(tenant=Tenant.objects.get(slug="acme"), max_queued_jobs=2)
    bob = client_for(people["bob"][1])
    body = {**TRAIN, "gpus": 64}
    assert (
        bob.post("/api/v1/jobs/", body, format="json").status_code == 201
    )  # the first makes the row
    with CaptureQueriesContext(connection) as ctx:
        response = bob.post("/api/v1/jobs/", body, format="json")
    assert response.status_code == 201, response.content
    writes = [q["sql"] for q in ctx.captured_queries if "INSERT" in q["sql"].upper()]
    if connection.vendor == "postgresql":
        assert len(writes) == 1 and writes[0].startswith(
            "WITH c AS (SELECT * FROM gpuplatform_queue_room("
        ), writes
        assert not [
            q for q in ctx.captured_queries if q["sql"].upper().startswith(("BEGIN", "COMMIT"))
        ]
    refused = bob.post("/api/v1/jobs/", body, format="json")
    assert refused.status_code == 429 and "has 2 of 2 jobs queued" in str(
        refused.json()["detail"]
    ), refused.content
    assert (
        Job.objects.filter(tenant__slug="acme", state=JobState.QUEUED).count() == 2 == kept("acme")
    )
    Job.objects.filter(tenant__slug="acme").update(state=JobState.CANCELLED)  # room again
    assert bob.post("/api/v1/jobs/", body, format="json").status_code == 201 and kept("acme") == 1


@pytest.mark.skipif(
    "connection.vendor != 'postgresql'", reason="prepared statements are PostgreSQL's"
)
@pytest.mark.django_db(transaction=True)
def test_a_submits_lock_check_and_inserts_are_one_prepared_statement_on_postgresql():
    """Outside a transaction the submit's one statement has the same text every time, so it is
    prepared on the server (rows._admit on `_prepared_cursor`): planned once per connection, not
    parsed and planned on every submit. A query string of two statements (the lock's, then the
    check's) could not be."""
    people = make_cast()
    make_node("h1", "H100-80GB", 8)
    park_node()
    generous("acme")
    bob = client_for(people["bob"][1])
    for _ in range(7):  # psycopg prepares a statement on its 6th run (prepare_threshold 5)
        assert bob.post("/api/v1/jobs/", {**TRAIN, "gpus": 64}, format="json").status_code == 201
    with connection.cursor() as cursor:
        cursor.execute("SELECT statement FROM pg_prepared_statements")
        statements = [statement for (statement,) in cursor.fetchall()]
    assert any("gpuplatform_queue_room($1, $2, $3)" in s for s in statements), statements
    assert kept("acme") == 7
