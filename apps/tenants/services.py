"""Tenant and user administration used by the management commands and the demo bootstrap."""

from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group
from django.db import transaction

from apps.tenants import roles, token_cache
from apps.tenants.models import Membership, Quota, Role, Tenant, Tier
from apps.tenants.tokens import token_issue


class TenantError(Exception):
    pass


@transaction.atomic
def tenant_create(
    *, slug: str, tier_name: str, allow_commands: bool = False, name: str = ""
) -> Tenant:
    tier = Tier.objects.filter(name=tier_name).first()
    if tier is None:
        raise TenantError(
            f"unknown tier {tier_name!r} (known: {', '.join(Tier.objects.values_list('name', flat=True))})"
        )
    tenant, _ = Tenant.objects.update_or_create(
        slug=slug, defaults={"tier": tier, "allow_commands": allow_commands, "name": name or slug}
    )
    Quota.objects.get_or_create(tenant=tenant)
    token_cache.tenants_changed(tenant_ids=[tenant.pk])  # its tier or allow_commands changed
    return tenant


@transaction.atomic
def user_create(*, username: str, tenant_slug: str | None, role: str = Role.MEMBER, staff: bool = False,
                superuser: bool = False, password: str | None = None, token: str | None = "default",
                token_days: int | None = None) -> tuple[object, str | None]:  # fmt: skip
    """Create (or update) a user in a tenant; returns the user and a new API token's key, issued
    under the name `token` (replacing the user's token of that name; None: no token, key None).

    `staff`: support staff (`is_staff`, group "support": no superuser powers); `superuser`: an
    operator with every permission (also staff)."""
    if role not in Role.values:
        raise TenantError(f"unknown role {role!r} (use {', '.join(Role.values)})")
    User = get_user_model()
    user, _ = User.objects.get_or_create(username=username)
    user.is_staff, user.is_superuser = staff or superuser, superuser
    if password:
        user.set_password(password)
    elif not user.has_usable_password():
        user.set_unusable_password()
    user.save()
    token_cache.revoked(user_ids=[user.pk])  # staff or not: judged on this row from now on
    if staff:
        roles.ensure_groups()
        user.groups.add(Group.objects.get(name=roles.SUPPORT))
    if tenant_slug:
        tenant = Tenant.objects.filter(slug=tenant_slug).first()
        if tenant is None:
            raise TenantError(f"unknown tenant {tenant_slug!r}")
        Membership.objects.update_or_create(user=user, defaults={"tenant": tenant, "role": role})
    key = token_issue(user=user, name=token, days=token_days)[1] if token else None
    return user, key


@transaction.atomic
def quota_set(*, tenant: Tenant, **limits) -> Quota:
    quota, _ = Quota.objects.select_for_update().get_or_create(tenant=tenant)
    max_gpus = limits.pop("max_gpus", None)
    for field, value in limits.items():
        if value is not None:
            setattr(quota, field, value)
    if max_gpus:
        quota.max_gpus = {**quota.max_gpus, **max_gpus}
    quota.save()
    token_cache.tenants_changed(tenant_ids=[tenant.pk])
    return quota
