"""Queue order, defined once: the higher tier level first, then the higher tier rank, then the
earlier submit. `queue_position`, the job list's positions, the 201's position and the start
estimate's replay all count in it (the policy starts jobs by its own rules: fair share, aging,
backfill; this is the simple, explainable figure users see).

Every form the platform needs (the ORM's ordering and "ahead of" filter, SQL for the submit
path's hand-written statements, a Python sort key) is derived here from `KEYS`.
"""

from __future__ import annotations

from functools import reduce
from operator import or_

from django.db.models import Q

# (a job's field path, descending?). Only numbers may be descending (the sort key negates them).
KEYS: tuple[tuple[str, bool], ...] = (
    ("tier__level", True),
    ("tier__rank", True),
    ("created_at", False),
)
TIER_KEYS = 2  # the first two keys are the tier's: jobs of one tier sort by the rest


def order_by() -> list[str]:
    """For `QuerySet.order_by`."""
    return [("-" if descending else "") + path for path, descending in KEYS]


def sort_key(level: int, rank: int, created_at) -> tuple:
    """A job's place in queue order as a tuple: smaller sorts first."""
    return (*tier_key(level, rank), created_at)


def tier_key(level: int, rank: int) -> tuple:
    """A tier's part of `sort_key`: a tier with a smaller one is ahead of the other."""
    return tuple(
        -v if descending else v for v, (_, descending) in zip((level, rank), KEYS, strict=False)
    )


def ahead_of(level: int, rank: int, created_at) -> Q:
    """Jobs before one with these values in queue order: lexicographic over KEYS."""
    values = (level, rank, created_at)
    terms = []
    for i, (path, descending) in enumerate(KEYS):
        equal = {p: v for (p, _), v in zip(KEYS[:i], values, strict=False)}
        terms.append(Q(**equal, **{f"{path}__{'gt' if descending else 'lt'}": values[i]}))
    return reduce(or_, terms)


def order_sql(columns: dict[str, str]) -> str:
    """An SQL ORDER BY list; `columns` maps each key's path to its column in the statement."""
    return ", ".join(
        f"{columns[path]} {'DESC' if descending else 'ASC'}" for path, descending in KEYS
    )
