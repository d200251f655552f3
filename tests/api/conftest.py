import pytest

from tests.factories import client_for, make_cast, make_node


@pytest.fixture
def cast(db):
    people = make_cast()
    make_node("h1", "H100-80GB", 8)
    return people


@pytest.fixture
def as_user(cast):
    def client(name: str | None):
        return client_for(cast[name][1] if name else None)

    return client
