"""This process's cache of submitters: a user's membership with its tenant, tier and quota, as
`rows.membership_of` reads them for every submit (one statement of a submit's two or three on
PostgreSQL), kept beside the API tokens they authenticated with and dropped the same way.

A follower of the token cache's revocation channel (apps/tenants/token_cache.py): `user:<id>`
drops a user's (a token revoked for all, a user or their membership changed), `tenant:<id>`
every member's of that tenant (the tenant or its quota changed), `tier:<id>` every member's of
a tenant of that tier. Every path that changes them publishes so (the admin, `create_tenant`,
`create_user`, `set_quota`, `set_tier`: apps/tenants/services.py and admin.py), reaching every
web process within 2 s; a change made any other way (SQL, a shell's `QuerySet.update`) takes
effect within TOKEN_CACHE_SECONDS, as does everything while a process's listener is away
(docs/operations.md, "API tokens").

The template and SKU a body names are not kept: a submit that names either reads them with the
membership as before (one statement).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TypeVar

from django.db import DEFAULT_DB_ALIAS
from django.db.models import Model

from apps.tenants import token_cache
from apps.tenants.models import Membership, Quota, Tenant, Tier
from apps.tenants.token_cache import columns


@dataclass
class Kept:
    """A membership and its tenant, tier and quota as their columns: each request gets instances
    of its own (`Model.from_db`, and a copy of the quota's `max_gpus` dict), so nothing one
    request sets on them reaches another."""

    membership: dict
    tenant: dict
    tier: dict
    quota: dict
    stored_at: float  # time.monotonic()

    def instances(self, user) -> Membership:
        """As rows.membership_of gives it (no template or SKU named), for `user`."""
        membership = _built(Membership, self.membership)
        tenant, tier, quota = (
            _built(Tenant, self.tenant),
            _built(Tier, self.tier),
            _built(Quota, self.quota),
        )
        quota.max_gpus = dict(quota.max_gpus or {})  # the one mutable column ({SKU: GPUs}): a copy
        membership.tenant, tenant.tier, tenant.quota = tenant, tier, quota
        membership.user = user
        membership.named = {}  # type: ignore[attr-defined]  # rows.membership_of: nothing named
        return membership


M = TypeVar("M", bound=Model)


def _built(model: type[M], values: dict) -> M:
    return model.from_db(DEFAULT_DB_ALIAS, list(values), list(values.values()))


class SubmitterCache(token_cache.RevocableCache[Kept]):
    """Submitters by user id."""

    def __init__(self) -> None:
        super().__init__(
            kind="user",
            owners={
                "tenant": lambda kept: str(kept.tenant["id"]),
                "tier": lambda kept: str(kept.tier["id"]),
            },
        )

    def get(self, user) -> Membership | None:
        """The user's membership, new instances, if stored less than TOKEN_CACHE_SECONDS ago."""
        kept = self.stored(str(user.pk))
        return None if kept is None else kept.instances(user)

    def put(self, user, membership: Membership | None, *, epoch: int) -> None:
        """Keep a membership read while `epoch` was current (with its tenant, tier and quota as
        rows.membership_of attaches them). None, or a tenant without its quota row (the first
        submit makes it: apps/jobs/services.py `tenant_limits`), is not kept."""
        if membership is None:
            return
        tenant = membership.tenant
        if not Tenant.quota.is_cached(tenant):
            return
        try:
            quota = tenant.quota
        except Quota.DoesNotExist:
            return
        kept = Kept(columns(membership), columns(tenant), columns(tenant.tier), columns(quota),
                    time.monotonic())  # fmt: skip
        self.put_value(str(user.pk), kept, epoch=epoch)


CACHE = SubmitterCache()
token_cache.follow(CACHE)
