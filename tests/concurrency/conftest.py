"""The concurrency stress suite runs on PostgreSQL only, with the server's own evidence on.

SQLite runs one writer at a time (a submit's transaction holds the database's write lock from
its BEGIN IMMEDIATE), so none of the interleavings this suite makes can happen there: it skips,
saying so. On PostgreSQL, every connection the suite opens (each thread has its own) logs its
lock waits (`log_lock_waits`) and looks for deadlocks after 20 ms instead of the server's 1 s
(`deadlock_timeout`), so a deadlock is broken, and shows in the server log, at once. Both are
superuser settings, set per session: CI connects as postgres. Where the role may not set
them, the suite runs without them and says so in its evidence."""

import pytest
from django.db import connection
from django.db.backends.signals import connection_created

SESSION = "SET log_lock_waits = on; SET deadlock_timeout = '20ms'"


def _evidence_settings(sender, connection, **kwargs):
    if connection.vendor != "postgresql":
        return
    with connection.cursor() as cursor:
        cursor.execute("SELECT rolsuper FROM pg_roles WHERE rolname = current_user")
        row = cursor.fetchone()
        if row and row[0]:
            cursor.execute(SESSION)


@pytest.fixture
def server_evidence(transactional_db):
    """log_lock_waits and a low deadlock_timeout on every connection opened from here on, and on
    this thread's own."""
    connection_created.connect(_evidence_settings)
    connection.ensure_connection()
    _evidence_settings(None, connection)
    try:
        yield
    finally:
        connection_created.disconnect(_evidence_settings)
