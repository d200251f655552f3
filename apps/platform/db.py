"""The database cursor the hot paths' hand-written statements run on."""

from __future__ import annotations

from django.conf import settings
from django.db import DEFAULT_DB_ALIAS, connections


def prepared_cursor(db=None):
    """On PostgreSQL a cursor that binds parameters on the server (psycopg's `Cursor`, as
    Django's OPTIONS `server_side_binding` would give every statement), so psycopg prepares a
    statement it has run `prepare_threshold` (5) times on this connection, and the server stops
    parsing and planning it. For the lookups every request makes (the token's, the submitter's),
    a submit's one statement and the queue window its answer reads (apps/admission/rows.py), and
    a report group's one update (apps/jobs/batch_reports.py). The token lookup joins six tables:
    planned, it took 1.4 ms; prepared, 0.4 ms (docs/bench/50-arrays.md). Made as Django's
    `connection.cursor()` makes one (health check, connection, thread check, its cursor
    wrapper). Django's own cursor elsewhere: on SQLite, where queries are logged (DEBUG,
    CaptureQueriesContext: the log of a prepared statement has no SQL) and where
    GPUPLATFORM_DB_PREPARED=0 (a pooler in transaction mode that keeps no prepared statements).
    `db`: a connection (default: this thread's for the default alias)."""
    db = db or connections[DEFAULT_DB_ALIAS]
    if db.vendor != "postgresql" or not settings.DB_PREPARED or db.queries_logged:
        return db.cursor()
    import psycopg  # the driver's public cursor; only reached on PostgreSQL

    db.close_if_health_check_failed()
    db.ensure_connection()
    db.validate_thread_sharing()
    return db.make_cursor(psycopg.Cursor(db.connection))
