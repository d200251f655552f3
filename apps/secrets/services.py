"""Tenant secrets: made, replaced, deleted and read here, and nowhere else.

Values are checked (a string, at most 64 KiB of UTF-8, no NUL) and encrypted (crypto.py) before
they reach a row; a value is decrypted only by `secret_values`, which the agent API's secrets
endpoint calls for an attempt placed on the asking node. Every change is in the audit log
(apps/tenants/audit.py: `record`) with who made it and the secret's name, never its value.
"""

from __future__ import annotations

import re

from django.contrib.admin.models import ADDITION, CHANGE, DELETION
from django.db import IntegrityError, transaction
from django.views.decorators.debug import sensitive_variables

from apps.platform import own_code
from apps.secrets import crypto
from apps.secrets.models import NAME_MAX, NAME_PATTERN, Secret
from apps.tenants.audit import record
from apps.tenants.models import Tenant

MAX_VALUE_BYTES = 64 * 1024
_NAME = re.compile(NAME_PATTERN)


class SecretError(Exception):
    """Bad input: `field` names the field at fault (the API answers 400 naming it)."""

    def __init__(self, field: str, message: str):
        super().__init__(message)
        self.field, self.message = field, message


def name_problem(name: object) -> str | None:
    if not isinstance(name, str):
        return "must be a string"
    if not name or len(name) > NAME_MAX or not _NAME.fullmatch(name):
        return f"must match {NAME_PATTERN} (A-Z, 0-9 and _, not starting with a digit), 1 to {NAME_MAX} characters"
    return own_code.name_problem(name)  # the names the platform sets in a job are reserved


@sensitive_variables()  # an error report shows none of these functions' locals
def value_problem(value: object) -> str | None:
    if not isinstance(value, str):
        return "must be a string"
    if "\x00" in value:
        return "must not contain NUL characters"
    try:
        size = len(value.encode("utf-8"))
    except UnicodeEncodeError:
        return "must be valid text (no unpaired surrogates)"
    if size > MAX_VALUE_BYTES:
        return f"must be at most {MAX_VALUE_BYTES} bytes of UTF-8 (this one is {size})"
    return None


@sensitive_variables()
def _check(name: object, value: object) -> None:
    for field, problem in (("name", name_problem(name)), ("value", value_problem(value))):
        if problem:
            raise SecretError(field, problem)


def tenant_secrets(tenant: Tenant):
    """The tenant's secrets, by name: only names and dates are ever shown."""
    return Secret.objects.filter(tenant=tenant).order_by("name")


@sensitive_variables()
def secret_create(*, tenant: Tenant, name: str, value: str, user) -> Secret:
    _check(name, value)
    ciphertext = crypto.encrypt(tenant_id=tenant.pk, name=name, value=value)
    try:
        with transaction.atomic():
            secret = Secret.objects.create(tenant=tenant, name=name, ciphertext=ciphertext,
                                           created_by=user, updated_by=user)  # fmt: skip
            record(user, secret, ADDITION, f"Created secret {name} (value not logged).")
    except IntegrityError:
        raise SecretError(
            "name", f"a secret named {name} exists already: PUT /api/v1/secrets/{name}/ replaces it"
        ) from None
    return secret


@transaction.atomic
@sensitive_variables()
def secret_replace(*, secret: Secret, value: str, user) -> Secret:
    _check(secret.name, value)
    secret.ciphertext = crypto.encrypt(tenant_id=secret.tenant_id, name=secret.name, value=value)
    secret.updated_by = user
    secret.save(update_fields=["ciphertext", "updated_by", "updated_at"])
    record(user, secret, CHANGE, f"Replaced the value of secret {secret.name} (value not logged).")
    return secret


@transaction.atomic
def secret_delete(*, secret: Secret, user) -> None:
    """Deleted at once: a job that names it and starts later fails (agent API, 410)."""
    record(user, secret, DELETION, f"Deleted secret {secret.name}.")
    secret.delete()


def missing_secrets(*, tenant_id: int, names: list[str]) -> list[str]:
    """The names of `names` the tenant has no secret of, in their order (empty: all exist).
    One indexed query; none for an empty list."""
    if not names:
        return []
    have = set(
        Secret.objects.filter(tenant_id=tenant_id, name__in=set(names)).values_list(
            "name", flat=True
        )
    )
    return [name for name in dict.fromkeys(names) if name not in have]


@sensitive_variables()
def secret_values(*, tenant_id: int, names: list[str]) -> tuple[dict[str, str], list[str]]:
    """`({name: value}, missing names)` of the tenant's secrets named. The only decrypt."""
    rows = Secret.objects.filter(tenant_id=tenant_id, name__in=set(names))
    values = {
        row.name: crypto.decrypt(tenant_id=tenant_id, name=row.name, ciphertext=row.ciphertext)
        for row in rows
    }
    return values, [name for name in dict.fromkeys(names) if name not in values]


@sensitive_variables()
def secrets_rotate() -> tuple[int, int]:
    """Re-encrypt every secret under the first key; `(rotated, unreadable)` counts. A row no
    configured key decrypts is left as it is (and counted)."""
    rotated = unreadable = 0
    for pk, ciphertext in Secret.objects.values_list("pk", "ciphertext").iterator():
        try:
            new = crypto.rotate(ciphertext)
        except crypto.SecretUnreadable:
            unreadable += 1
            continue
        # The value is unchanged: updated_at stays (an update(), not a save()).
        rotated += Secret.objects.filter(pk=pk, ciphertext=ciphertext).update(ciphertext=new)
    return rotated, unreadable
