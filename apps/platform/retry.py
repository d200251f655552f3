"""A transaction PostgreSQL aborted to break a deadlock or a serialization conflict, run again
whole (docs/reliability.md, "Concurrency").

Row locks are taken in one fixed order wherever a service can know its rows up front; where it
cannot (a job's end settles its followers and dependents, each move of a queued job takes its
tenant's count row through the jobs table's triggers), PostgreSQL may still pick a transaction
as a deadlock's victim. `retried` runs such a service again from the start, in a fresh
transaction, at most TRIES times with a jittered pause, so the caller sees one outcome, never
the abort. Nothing of a rolled-back try survives it: its rows go with the rollback, its commit
hooks (`transaction.on_commit`, the after-commit events, the dispatch request) are dropped by
Django with it, and every effect outside the database waits for a commit. Only the outermost
transaction can be run again: inside another one, a service runs once and the abort reaches
the owner of the enclosing transaction, which retries it whole if it is `retried` itself.
After the last try the abort becomes `Contended`, a 503 with Retry-After.
"""

from __future__ import annotations

import functools
import logging
import random
import time
from collections.abc import Callable
from typing import ParamSpec, TypeVar

from django.db import DatabaseError, connection

from apps.platform.errors import ServiceError

log = logging.getLogger(__name__)

TRIES = 3
PAUSE_S = 0.02  # the first retry waits up to this long, the second up to twice as long
# SQLSTATEs of an abort that a run of the same transaction again can pass.
DEADLOCK, SERIALIZATION = "40P01", "40001"
UNIQUE_VIOLATION = "23505"
P = ParamSpec("P")
R = TypeVar("R")


class Contended(ServiceError):
    """The database aborted the same work TRIES times in a row: answered 503, try again."""

    status = 503


def sqlstate(error: BaseException) -> str | None:
    """The SQLSTATE of a database error (psycopg's, under Django's wrapper), or None."""
    cause = error.__cause__ if error.__cause__ is not None else error
    return getattr(cause, "sqlstate", None)


def _constraint(error: BaseException) -> str | None:
    diag = getattr(error.__cause__, "diag", None)
    return getattr(diag, "constraint_name", None)


def retryable(error: BaseException, constraints: tuple[str, ...] = ()) -> bool:
    """A deadlock or serialization failure; or a unique violation of one of `constraints`
    (a race the constraint decided: run again, the loser reads the winner's row)."""
    if not isinstance(error, DatabaseError):
        return False
    state = sqlstate(error)
    if state in (DEADLOCK, SERIALIZATION):
        return True
    return state == UNIQUE_VIOLATION and _constraint(error) in constraints


def retried(func: Callable[P, R]) -> Callable[P, R]:
    """Decorator for a service that is a transaction of its own (`@transaction.atomic` below
    it): called outside any transaction, an abort (`retryable`) runs it again, up to TRIES
    times; called inside one, it runs once."""
    return retried_on()(func)


def retried_on(*constraints: str) -> Callable[[Callable[P, R]], Callable[P, R]]:
    """`retried`, where a violation of one of these unique constraints also means "run again"
    (a concurrent insert won: the next try reads the winner's row)."""

    def wrap(func: Callable[P, R]) -> Callable[P, R]:
        @functools.wraps(func)
        def run(*args: P.args, **kwargs: P.kwargs) -> R:
            if connection.in_atomic_block:
                return func(*args, **kwargs)
            return run_retried(lambda: func(*args, **kwargs), constraints=constraints,
                               what=func.__qualname__)  # fmt: skip

        return run

    return wrap


def run_retried(work: Callable[[], R], *, constraints: tuple[str, ...] = (), what: str = "") -> R:
    """`work()` (a whole transaction), run again after a retryable abort; see `retried`."""
    for attempt in range(1, TRIES + 1):
        try:
            return work()
        except DatabaseError as error:
            if not retryable(error, constraints) or connection.in_atomic_block:
                raise
            if attempt == TRIES:
                log.warning("%s: aborted %d times (%s), giving up: %s", what, TRIES,
                            sqlstate(error), str(error).splitlines()[0])  # fmt: skip
                raise Contended(
                    "the database was too busy to take this request; try again", retry_after=1
                ) from error
            log.info("%s: aborted (%s), running it again (try %d of %d): %s", what,
                     sqlstate(error), attempt + 1, TRIES, str(error).splitlines()[0])  # fmt: skip
            time.sleep(random.uniform(0, PAUSE_S * 2 ** (attempt - 1)))
    raise AssertionError("unreachable")  # the loop returns or raises
