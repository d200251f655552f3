"""A transaction PostgreSQL aborted runs again whole (apps/platform/retry.py): a deadlock or a
serialization failure up to three tries, then a 503; anything else at once; never inside
another transaction, whose owner alone can run it again."""

import psycopg
import pytest
from django.db import IntegrityError, OperationalError, transaction

from apps.platform import retry
from apps.platform.retry import Contended, retried, retried_on

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def no_pause(monkeypatch):
    monkeypatch.setattr(retry, "PAUSE_S", 0.0)


def aborted(kind=psycopg.errors.DeadlockDetected, message="deadlock detected"):
    error = OperationalError(message)
    error.__cause__ = kind(message)
    return error


def failing(times: int, error=None):
    calls = []

    @retried
    @transaction.atomic
    def work():
        calls.append(1)
        if len(calls) <= times:
            raise error or aborted()
        return "done"

    return work, calls


def test_a_deadlock_victim_runs_again_and_succeeds():
    work, calls = failing(2)
    assert work() == "done"
    assert len(calls) == 3


def test_a_serialization_failure_runs_again_too():
    work, calls = failing(1, aborted(psycopg.errors.SerializationFailure, "could not serialize"))
    assert work() == "done"
    assert len(calls) == 2


def test_three_aborts_in_a_row_are_a_503_with_retry_after():
    work, calls = failing(3)
    with pytest.raises(Contended) as refused:
        work()
    assert len(calls) == 3
    assert (refused.value.status, refused.value.retry_after) == (503, 1)


def test_any_other_error_is_raised_at_once():
    work, calls = failing(1, OperationalError("server closed the connection"))
    with pytest.raises(OperationalError):
        work()
    assert len(calls) == 1


def test_inside_another_transaction_it_runs_once_and_the_abort_reaches_its_owner():
    work, calls = failing(1)
    with pytest.raises(OperationalError), transaction.atomic():
        work()
    assert len(calls) == 1


class Diagnosed(psycopg.errors.UniqueViolation):
    """psycopg fills `diag` from the server's answer; this one names the constraint by hand."""

    class diag:  # noqa: N801 (psycopg's attribute)
        constraint_name = "the_constraint"


def test_a_named_unique_constraint_lost_to_a_concurrent_insert_runs_again():
    calls = []

    @retried_on("the_constraint")
    def work():
        calls.append(1)
        if len(calls) == 1:
            raise IntegrityError("duplicate key") from Diagnosed("duplicate key")
        return "joined"

    assert work() == "joined"
    assert len(calls) == 2


def test_another_unique_constraint_is_raised_at_once():
    calls = []

    @retried_on("another")
    def work():
        calls.append(1)
        raise IntegrityError("duplicate key") from Diagnosed("duplicate key")

    with pytest.raises(IntegrityError):
        work()
    assert len(calls) == 1
