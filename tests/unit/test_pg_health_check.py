"""The connection health check without a round trip (gpuplatform/postgresql/base.py): an idle
connection the server said nothing on is usable at no statement's cost; one the server closed
is found out and replaced before the request's first statement, as Django's `SELECT 1` did."""

import select
import time

import pytest
from django.db import DEFAULT_DB_ALIAS, close_old_connections, connection, connections
from django.db.backends.postgresql import base

from gpuplatform import settings as platform_settings
from gpuplatform.postgresql.base import DatabaseWrapper, quiet

pytestmark = [
    pytest.mark.skipif(
        "connection.vendor != 'postgresql'", reason="the health check is PostgreSQL's"
    ),
    pytest.mark.django_db(transaction=True),
]


@pytest.fixture
def select_ones(monkeypatch):
    """Django's own check (`SELECT 1`), counted."""
    calls = []
    own = base.DatabaseWrapper.is_usable

    def counted(self):
        calls.append(self.alias)
        return own(self)

    monkeypatch.setattr(base.DatabaseWrapper, "is_usable", counted)
    return calls


def backend_pid() -> int:
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()")
        return cursor.fetchone()[0]


def test_a_postgres_url_gets_this_backend(monkeypatch):
    monkeypatch.setenv("DATABASE_URL", "postgres://u@db.example:5432/d")
    assert platform_settings._database()["ENGINE"] == "gpuplatform.postgresql"
    assert isinstance(connections[DEFAULT_DB_ALIAS], DatabaseWrapper)
    assert connection.settings_dict["CONN_HEALTH_CHECKS"]


def test_a_request_on_a_quiet_connection_sends_no_select_1(select_ones):
    pid = backend_pid()
    for _ in range(3):  # as each request starts: the check again before its first statement
        close_old_connections()
        assert backend_pid() == pid
    assert select_ones == []


def test_a_connection_the_server_closed_is_replaced_before_the_first_statement(select_ones):
    pid = backend_pid()
    other = connections.create_connection(DEFAULT_DB_ALIAS)
    try:
        with other.cursor() as cursor:
            cursor.execute("SELECT pg_terminate_backend(%s)", [pid])
    finally:
        other.close()
    poller = select.poll()
    poller.register(connection.connection.fileno(), select.POLLIN)
    deadline = time.monotonic() + 5
    while not poller.poll(50) and time.monotonic() < deadline:
        pass  # the server's goodbye on its way
    assert not quiet(connection.connection)
    close_old_connections()  # a new request
    assert backend_pid() != pid  # reconnected, no error
    assert select_ones == [DEFAULT_DB_ALIAS]  # Django's SELECT 1 decided, and failed


def test_inside_a_transaction_django_checks_as_before(select_ones):
    connection.ensure_connection()
    with connection.cursor() as cursor:
        cursor.execute("BEGIN")
        try:
            assert connection.is_usable()
        finally:
            cursor.execute("ROLLBACK")
    assert select_ones == [DEFAULT_DB_ALIAS]
