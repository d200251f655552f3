"""apps/admission/writer.py on SQLite: a web process keeps the database open, so a request's
connection closing after a submission does not checkpoint and delete the WAL."""

import os
import pathlib

import pytest
from django.db import connection, transaction

from apps.admission import writer

pytestmark = pytest.mark.skipif(
    connection.vendor != "sqlite", reason="SQLite's write turns and WAL"
)


def wal_of() -> pathlib.Path:
    return pathlib.Path(f"{connection.settings_dict['NAME']}-wal")


def test_a_connection_closing_after_a_submission_leaves_the_wal_alone(transactional_db):
    if writer._lock_path() is None:
        pytest.skip("an in-memory test database has no WAL")
    with writer.write_turn(), transaction.atomic():
        with connection.cursor() as cursor:
            cursor.execute("CREATE TABLE IF NOT EXISTS writer_probe (x INTEGER)")
            cursor.execute("INSERT INTO writer_probe VALUES (1)")
    assert os.getpid() in writer._kept
    assert wal_of().exists()
    connection.close()  # a request's connection closing: not the last connection any more
    assert wal_of().exists() and wal_of().stat().st_size > 0
    with connection.cursor() as cursor:
        cursor.execute("SELECT COUNT(*) FROM writer_probe")
        assert cursor.fetchone()[0] >= 1
        cursor.execute("DROP TABLE writer_probe")
