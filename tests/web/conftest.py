import pytest
from django.test import Client

from apps.admission import buckets
from tests.factories import make_cast, make_node


@pytest.fixture(autouse=True)
def fresh_buckets():
    """Rate-limit buckets are keyed by database ids, which a rolled-back test gives out again."""
    conn = buckets.client()
    for key in conn.scan_iter(f"{buckets.PREFIX}*"):
        conn.delete(key)


@pytest.fixture
def cast(db):
    people = make_cast()
    make_node("h1", "H100-80GB", 8)
    make_node("a1", "A100-40GB", 4)
    return people


@pytest.fixture
def browser_as(cast):
    """A Django test client signed in (session) as one of the cast, or anonymous."""

    def client(name: str | None) -> Client:
        c = Client()
        if name:
            c.force_login(cast[name][0])
        return c

    return client


@pytest.fixture
def as_user(cast):
    """An API client with one of the cast's tokens (None: no token)."""
    from tests.factories import client_for

    def client(name: str | None):
        return client_for(cast[name][1] if name else None)

    return client
