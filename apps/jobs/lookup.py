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

from apps.platform.errors import UnknownObject

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
    digits = len(text.replace("-", ""))
    try:
        if digits == 32:
            return uuid.UUID(text)  # a whole id: no read here, the caller's own lookup 404s
    except ValueError:
        pass
    span = prefix_range(text)
    if span is None:
        raise NotFound()  # not an id at all: the 404 of a path no route matches
    if digits < MIN_PREFIX:
        raise NotFound(
            f"no such {what}: an id prefix needs at least {MIN_PREFIX} characters, {text!r} has {digits}"
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
        message = f"{text!r} is ambiguous: it starts more than one {what}'s id ({shown}); give more of the id"
        raise ValidationError({field: [message]})
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


def whole_parent_ids(body, *, jobs: QuerySet, arrays: QuerySet):
    """A submit body whose `depends_on` names a parent by an id prefix, with that parent's whole
    id (`jobs` and `arrays`: the caller's). Anything else is left for the serializer to judge;
    a prefix that fits none is the 404 an unknown whole id gets, naming `depends_on`."""
    entries = body.get("depends_on") if type(body) is dict else None  # a JSON object's body
    if not isinstance(entries, list) or not any(_prefix_entry(e) for e in entries):
        return body
    completed = []
    for entry in entries:
        kind = _prefix_entry(entry)
        if kind is None:
            completed.append(entry)
            continue
        rows = jobs if kind == "job" else arrays
        try:
            pk = resolve(rows, entry[kind], what=f"job {kind}" if kind == "array" else kind,
                         field="depends_on")  # fmt: skip
        except NotFound:
            raise UnknownObject(f"no {kind} {entry[kind]}", field="depends_on") from None
        completed.append({**entry, kind: str(pk)})
    return {**body, "depends_on": completed}


def _prefix_entry(entry) -> str | None:
    """ "job" or "array" for a `depends_on` entry that names its parent by an id prefix."""
    if not isinstance(entry, dict):
        return None
    kinds = [kind for kind in ("job", "array") if isinstance(entry.get(kind), str)]
    if len(kinds) != 1:
        return None
    raw = entry[kinds[0]].strip()
    digits = raw.replace("-", "")
    if prefix_range(raw) is None or not MIN_PREFIX <= len(digits) < 32:
        return None
    return kinds[0]
