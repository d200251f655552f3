"""Tenant and user administration used by the management commands and the demo bootstrap."""

from django.contrib.auth import get_user_model
from django.db import transaction
from rest_framework.authtoken.models import Token

from apps.tenants.models import Membership, Quota, Role, Tenant, Tier


class TenantError(Exception):
    pass


@transaction.atomic
def tenant_create(*, slug: str, tier_name: str, allow_commands: bool = False, name: str = "") -> Tenant:
    tier = Tier.objects.filter(name=tier_name).first()
    if tier is None:
        raise TenantError(f"unknown tier {tier_name!r} (known: {', '.join(Tier.objects.values_list('name', flat=True))})")
    tenant, _ = Tenant.objects.update_or_create(
        slug=slug, defaults={"tier": tier, "allow_commands": allow_commands, "name": name or slug}
    )
    Quota.objects.get_or_create(tenant=tenant)
    return tenant


@transaction.atomic
def user_create(*, username: str, tenant_slug: str | None, role: str = Role.MEMBER, staff: bool = False,
                password: str | None = None) -> tuple[object, str]:  # fmt: skip
    """Create (or update) a user in a tenant; returns the user and their API token key."""
    if role not in Role.values:
        raise TenantError(f"unknown role {role!r} (use {', '.join(Role.values)})")
    User = get_user_model()
    user, _ = User.objects.get_or_create(username=username)
    user.is_staff = user.is_superuser = staff
    if password:
        user.set_password(password)
    elif not user.has_usable_password():
        user.set_unusable_password()
    user.save()
    if tenant_slug:
        tenant = Tenant.objects.filter(slug=tenant_slug).first()
        if tenant is None:
            raise TenantError(f"unknown tenant {tenant_slug!r}")
        Membership.objects.update_or_create(user=user, defaults={"tenant": tenant, "role": role})
    token, _ = Token.objects.get_or_create(user=user)
    return user, token.key


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
    return quota
