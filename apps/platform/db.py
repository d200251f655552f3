"""The database cursor the hot paths' hand-written statements run on."""

from __future__ import annotations

from typing import cast

from django.conf import settings
from django.db import DEFAULT_DB_ALIAS, connection, connections
from django.db.models import Field, Model


def table(model: type[Model]) -> str:
    """The model's table, quoted for this connection's backend (a hand-written statement's)."""
    return connection.ops.quote_name(model._meta.db_table)


def column(model: type[Model], name: str) -> str:
    """The column of `model`'s field `name`, quoted for this connection's backend."""
    return connection.ops.quote_name(cast(Field, model._meta.get_field(name)).column)


def among(column: str, field: Field, ids) -> tuple[str, list]:
    """The condition that `column` (of `field`'s type) is one of `ids`, and its parameters: on
    PostgreSQL one array parameter, so the statement's text is the same for any count and psycopg
    prepares it; elsewhere (SQLite) a placeholder an id, each prepared as the field prepares it
    (none: `1 = 0`)."""
    if connection.vendor == "postgresql":
        return f"{column} = ANY(%s::{field.db_type(connection)}[])", [list(ids)]
    values = [field.get_db_prep_value(value, connection) for value in ids]
    if not values:
        return "1 = 0", []
    return f"{column} IN ({', '.join(['%s'] * len(values))})", values


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
    if not _prepares(db):
        return db.cursor()
    import psycopg  # the driver's public cursor; only reached on PostgreSQL

    return _server_bound(db, psycopg.Cursor)


def _prepares(db) -> bool:
    return db.vendor == "postgresql" and settings.DB_PREPARED and not db.queries_logged


def _server_bound(db, cursor_class):
    db.close_if_health_check_failed()
    db.ensure_connection()
    db.validate_thread_sharing()
    return db.make_cursor(cursor_class(db.connection))


class NumberedStatement:
    """A statement of many parameters run as `prepared_cursor` runs one, without psycopg
    rewriting its placeholders on every run. psycopg's `Cursor` turns each %s into PostgreSQL's
    own $1, $2, ... before every execute, and keeps the rewritten text only for a statement of at
    most 50 parameters (psycopg's MAX_CACHED_STATEMENT_PARAMS); above that it splits the text
    again each time. A submit's admit (apps/admission/rows.py, 62 parameters) is written here once
    in both forms, and the server-bound run sends the numbered one through psycopg's `RawCursor`,
    which takes $n placeholders and sends the text as it is: the same text the rewrite gave, so
    the server prepares and plans it as before. Where `prepared_cursor` gives Django's cursor
    (SQLite, logged queries, GPUPLATFORM_DB_PREPARED=0), `sql` runs there, %s and all."""

    def __init__(self, sql: str):
        parts = sql.split("%s")
        if any("%" in part for part in parts):
            raise ValueError("a numbered statement's only % are its %s placeholders")
        self.sql = sql
        self.numbered = parts[0] + "".join(f"${n}{part}" for n, part in enumerate(parts[1:], 1))

    def fetchone(self, params: list, db=None):
        """The first row of the statement run with `params`, or None."""
        db = db or connections[DEFAULT_DB_ALIAS]
        if _prepares(db):
            import psycopg  # as in prepared_cursor

            cursor, sql = _server_bound(db, psycopg.RawCursor), self.numbered
        else:
            cursor, sql = db.cursor(), self.sql
        with cursor:
            cursor.execute(sql, params)
            return cursor.fetchone()


class Reader:
    """One model's columns in a hand-written SELECT under `alias`, and the instance back from its
    slice of a row as the ORM builds it: the backend's and the field's converters, then
    `Model.from_db` (apps/admission/rows.py's submit reads, apps/jobs/services.py's report reads)."""

    def __init__(self, model: type[Model], alias: str):
        quote = connection.ops.quote_name
        self.model, self.alias = model, alias
        self.fields = list(model._meta.concrete_fields)
        self.attnames = [field.attname for field in self.fields]
        self.columns = ", ".join(f"{quote(alias)}.{quote(field.column)}" for field in self.fields)
        self.converters = [converters_of(field, alias) for field in self.fields]
        self.width = len(self.fields)
        self.pk_index = self.fields.index(model._meta.pk)

    def build(self, values, db=None) -> Model | None:
        """The instance from this model's slice of a row (None for the NULLs of an outer join).
        `db`: the connection the row came from (default: this thread's for the default alias)."""
        if values[self.pk_index] is None:
            return None
        db = db or connections[DEFAULT_DB_ALIAS]
        converted = [
            convert(value, c, db) for value, c in zip(values, self.converters, strict=True)
        ]
        return self.model.from_db(db.alias, self.attnames, converted)


def converters_of(field, alias: str) -> tuple[list, object]:
    """A column's converters (the backend's, then the field's), with the expression they take."""
    column = field.get_col(alias)
    return connection.ops.get_db_converters(column) + column.get_db_converters(connection), column


def convert(value, converters: tuple[list, object], db):
    found, column = converters
    for converter in found:
        value = converter(value, column, db)
    return value
