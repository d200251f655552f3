"""The queue window's left-out ids go to PostgreSQL as one text parameter in the array's own
syntax (apps/admission/rows.py `uuid_array`), not a list psycopg dumps id by id: the server
reads the same `uuid[]` either way, none, one or many."""

import uuid

import pytest
from django.db import connection

from apps.admission import rows


def test_the_text_is_postgresqls_array_syntax():
    ids = [uuid.UUID(int=1), uuid.UUID("0a5b4e7e-2d2a-4cbb-9a51-96f1d1e0c0ff")]
    assert rows.uuid_array([]) == "{}"
    assert rows.uuid_array(ids) == (
        "{00000000-0000-0000-0000-000000000001,0a5b4e7e-2d2a-4cbb-9a51-96f1d1e0c0ff}"
    )
    assert rows.uuid_array(dict.fromkeys(ids)) == rows.uuid_array(ids)  # a window's `seen`


@pytest.mark.django_db
@pytest.mark.parametrize("count", [0, 1, 40])
def test_postgresql_reads_the_same_array_as_from_a_list(count):
    if connection.vendor != "postgresql":
        pytest.skip("the parameter is PostgreSQL's (SQLite drops seen rows after the read)")
    ids = [uuid.uuid4() for _ in range(count)]
    with connection.cursor() as cursor:
        cursor.execute("SELECT %s::uuid[], %s::uuid[]", [rows.uuid_array(ids), ids])
        as_text, as_list = cursor.fetchone()
    assert as_text == as_list == ids
