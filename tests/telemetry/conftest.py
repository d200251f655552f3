import pytest

from tests.factories import make_cast


@pytest.fixture
def cast(db):
    return make_cast()
