"""Job and array ids as people type them: the whole UUID, or a unique prefix of at least
MIN_PREFIX characters (as git and docker take them; ../shared/API.md, v3).

A prefix is looked up only among the rows the caller may see (the queryset it is given), so
another tenant's ids never match and never make a prefix ambiguous. A prefix is a range of
UUIDs, read through the primary key's index on SQLite and PostgreSQL alike.
"""

from __future__ import annotations

import re
import uuid

from django.db.models import QuerySet
from rest_framework.exceptions import NotFound, ValidationError

MIN_PREFIX = 8
_HEX = re.compile(r"^[0-9a-f]+$")


def prefix_range(raw: object) -> tuple[uuid.UUID, uuid.UUID] | None:
    """The ids a prefix stands for, lowest and highest; None for text that is no id prefix
    (hyphens are allowed and ignored: `1a2b3c4d-5e` and `1a2b3c4d5e` are the same prefix)."""
    digits = str(raw).strip().lower().replace("-", "")
    if not _HEX.match(digits) or len(digits) > 32:
        return None
    return uuid.UUID(digits.ljust(32, "0")), uuid.UUID(digits.ljust(32, "f"))


def resolve(queryset: QuerySet, raw: object, *, what: str, field: str = "id") -> uuid.UUID:
    """The id of the one row of `queryset` that `raw` names (its whole id, or a unique prefix):
    404 when none does (or `raw` is too short to be a prefix), 400 naming `field` when the prefix
    fits several."""
    text = str(raw).strip()
    try:
        if len(text.replace("-", "")) == 32:
            return uuid.UUID(text)  # a whole id: no read here, the caller's own lookup 404s
    except ValueError:
        pass
    span = prefix_range(text)
    if span is None:
        raise NotFound()  # not an id at all: the 404 of a path no route matches
    if len(text.replace("-", "")) < MIN_PREFIX:
        raise NotFound(
            f"no such {what}: an id prefix needs at least {MIN_PREFIX} characters, {text!r} has "
            f"{len(text.replace('-', ''))}"
        )
    low, high = span
    found = list(
        queryset.prefetch_related(None)
        .filter(pk__gte=low, pk__lte=high)
        .order_by("pk")
        .values_list("pk", flat=True)[:3]
    )
    if not found:
        raise NotFound()
    if len(found) > 1:
        shown = ", ".join(str(pk) for pk in found[:2]) + (", ..." if len(found) > 2 else "")
        raise ValidationError(
            {
                field: [
                    f"{text!r} is ambiguous: it starts more than one {what}'s id ({shown}); "
                    f"give more of the id"
                ]
            }  # fmt: skip
        )
    return found[0]


class PrefixLookupMixin:
    """For a viewset whose objects are jobs or arrays: `{id}` in its paths may be a unique id
    prefix. The prefix becomes the whole id before DRF's own `get_object` runs (the same
    queryset, so the same 404s)."""

    id_noun = "object"

    def get_object(self):
        kwarg = self.lookup_url_kwarg or self.lookup_field  # type: ignore[attr-defined]
        self.kwargs[kwarg] = str(  # type: ignore[attr-defined]
            resolve(self.get_queryset(), self.kwargs[kwarg], what=self.id_noun)  # type: ignore[attr-defined]
        )
        return super().get_object()  # type: ignore[misc]
