"""A submit's admit (rows.admit: the cap's check and both inserts in one statement, PostgreSQL)
has 62 parameters, more than psycopg keeps its placeholders' rewrite for: it is written once in
PostgreSQL's numbered form and sent as it is (apps/platform/db.py, `NumberedStatement`)."""

import psycopg
import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from apps.jobs.models import Job
from apps.platform.db import NumberedStatement
from tests.admission.conftest import TRAIN, generous
from tests.factories import client_for, make_cast, make_node, park_node

ON_POSTGRESQL = pytest.mark.skipif(
    "connection.vendor != 'postgresql'", reason="the numbered form is PostgreSQL's"
)
NEVER_FITS = {**TRAIN, "gpus": 64}  # stays queued on the parked node: nothing else runs


def test_a_numbered_statement_has_postgresqls_placeholders_in_order():
    statement = NumberedStatement("SELECT %s, %s FROM t WHERE a = %s")
    assert statement.numbered == "SELECT $1, $2 FROM t WHERE a = $3"
    assert statement.sql == "SELECT %s, %s FROM t WHERE a = %s"
    with pytest.raises(ValueError):  # a literal % means something else in each form
        NumberedStatement("SELECT %s WHERE name LIKE 'a%%'")


@pytest.mark.django_db
def test_a_numbered_statement_of_more_than_fifty_parameters_reads_them_back_on_every_backend():
    values = list(range(60))
    statement = NumberedStatement("SELECT " + ", ".join(["%s"] * len(values)))
    assert tuple(statement.fetchone(values)) == tuple(values)


@ON_POSTGRESQL
@pytest.mark.django_db(transaction=True)
def test_a_submits_admit_goes_numbered_to_a_raw_cursor_and_is_prepared(monkeypatch):
    """psycopg's RawCursor sends the text as it is; the server prepares it as before (psycopg
    prepares a statement on its 6th run)."""
    sent = []

    class Recording(psycopg.RawCursor):
        def execute(self, query, params=None, **kwargs):
            sent.append(query)
            return super().execute(query, params, **kwargs)

    monkeypatch.setattr(psycopg, "RawCursor", Recording)
    people = make_cast()
    make_node("h1", "H100-80GB", 8)
    park_node()
    generous("acme")
    bob = client_for(people["bob"][1])
    for _ in range(7):
        assert bob.post("/api/v1/jobs/", NEVER_FITS, format="json").status_code == 201
    admits = [sql for sql in sent if "gpuplatform_queue_room" in sql]
    assert len(admits) == 7 and "$62" in admits[0] and "%s" not in admits[0], sent
    with connection.cursor() as cursor:
        cursor.execute("SELECT statement FROM pg_prepared_statements")
        prepared = [statement for (statement,) in cursor.fetchall()]
    assert admits[0] in prepared
    assert Job.objects.filter(tenant__slug="acme").count() == 7


@ON_POSTGRESQL
@pytest.mark.django_db(transaction=True)
def test_where_queries_are_logged_or_not_prepared_the_admit_runs_on_djangos_cursor(settings):
    people = make_cast()
    make_node("h1", "H100-80GB", 8)
    park_node()
    generous("acme")
    bob = client_for(people["bob"][1])
    with CaptureQueriesContext(connection) as ctx:
        assert bob.post("/api/v1/jobs/", NEVER_FITS, format="json").status_code == 201
    logged = [q["sql"] for q in ctx.captured_queries if "gpuplatform_queue_room" in q["sql"]]
    assert len(logged) == 1 and "$1" not in logged[0], logged  # values in place, as logged
    settings.DB_PREPARED = False
    assert bob.post("/api/v1/jobs/", NEVER_FITS, format="json").status_code == 201
    assert Job.objects.filter(tenant__slug="acme").count() == 2
