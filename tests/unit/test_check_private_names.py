"""scripts/check_private_names.py (in `make lint`): no module under apps/ uses Django's, DRF's or
a driver's private names; a planted one is flagged."""

import textwrap

from scripts import check_private_names

PLANTED = """
from django.db.backends.postgresql.base import ServerBindingCursor
from django.db.models.base import _private_helper
from apps.tenants.models import Tenant


class Mine:
    def __init__(self):
        self._pools = {}

    def pools(self):
        return self._pools


def saved(instance, db, request, other: Mine):
    instance._state.adding = False
    db._prepare_cursor(None)
    db.validate_no_broken_transaction()
    Tenant.tier.field.set_cached_value(instance, None)
    raw = db.connection.cursor()
    body = request._request.body
    return instance._meta.concrete_fields, other._pools, raw, body
"""


def test_apps_uses_no_private_names_of_django_or_a_driver():
    assert check_private_names.check() == []


def test_a_planted_use_of_private_names_is_flagged(tmp_path):
    (tmp_path / "planted.py").write_text(textwrap.dedent(PLANTED))
    found = check_private_names.check(tmp_path)
    text = "\n".join(found)
    for what in ("django.db.backends.postgresql.base", "_private_helper", "._state", "._prepare_cursor",
                 ".validate_no_broken_transaction", ".set_cached_value", "raw driver cursor", "._request"):  # fmt: skip
        assert what in text, text
    assert "_meta" not in text and "_pools" not in text  # Django's public _meta, and our own names
    assert len(found) == 8, text
