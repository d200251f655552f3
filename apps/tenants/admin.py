from django.contrib import admin
from django.contrib.admin.exceptions import NotRegistered
from django.contrib.auth import get_user_model
from django.contrib.auth.admin import UserAdmin
from rest_framework.authtoken.models import TokenProxy

from apps.tenants import token_cache
from apps.tenants.audit import AuditedAdmin
from apps.tenants.models import ApiToken, Membership, Quota, Tenant, Tier

try:  # DRF's clear-text tokens are no longer used (apps/tenants/tokens.py); its app stays for a migration
    admin.site.unregister(TokenProxy)
except NotRegistered:
    pass
User = get_user_model()
try:  # Django's own, registered again below with the token cache told of every change
    admin.site.unregister(User)
except NotRegistered:
    pass


@admin.register(User)
class TokenAwareUserAdmin(UserAdmin):
    """Django's user admin. A user changed here (made inactive, staff or not, other groups) or
    deleted is dropped with all their tokens from every web process's token cache
    (apps/tenants/token_cache.py), so that their next request is judged on the new row."""

    def save_model(self, request, obj, form, change):
        super().save_model(request, obj, form, change)
        token_cache.revoked(user_ids=[obj.pk])

    def delete_model(self, request, obj):
        token_cache.revoked(user_ids=[obj.pk])
        super().delete_model(request, obj)

    def delete_queryset(self, request, queryset):
        token_cache.revoked(user_ids=list(queryset.values_list("pk", flat=True)))
        super().delete_queryset(request, queryset)


class SubmitterPartAdmin(AuditedAdmin):
    """An admin of a part of who submits (a tier, a tenant, its quota, a membership), which each
    web process keeps for a submit (apps/admission/submitters.py): a change or a deletion here
    drops what it kept of them from every process's cache (apps/tenants/token_cache.py), within
    2 s. `drop` is called before the rows change: a membership's old user is read then."""

    def drop(self, objs: list) -> None:
        raise NotImplementedError

    def save_model(self, request, obj, form, change):
        self.drop([obj])
        super().save_model(request, obj, form, change)

    def delete_model(self, request, obj):
        self.drop([obj])
        super().delete_model(request, obj)

    def delete_queryset(self, request, queryset):
        self.drop(list(queryset))
        super().delete_queryset(request, queryset)


@admin.register(Tier)
class TierAdmin(SubmitterPartAdmin):
    list_display = [
        "name",
        "rank",
        "level",
        "weight",
        "preemptible",
        "can_preempt",
        "max_queued_jobs",
        "submit_rate_per_minute",
    ]
    search_fields = ["name"]

    def drop(self, objs: list) -> None:
        token_cache.tenants_changed(tier_ids=[tier.pk for tier in objs])


class QuotaInline(admin.StackedInline):
    model = Quota
    can_delete = False


@admin.register(Tenant)
class TenantAdmin(SubmitterPartAdmin):
    list_display = ["slug", "name", "tier", "allow_commands", "created_at"]
    list_filter = ["tier", "allow_commands"]
    list_select_related = ["tier"]
    search_fields = ["slug", "name"]
    inlines = [QuotaInline]  # saved in the same transaction: the tenant's drop covers its quota

    def drop(self, objs: list) -> None:
        token_cache.tenants_changed(tenant_ids=[tenant.pk for tenant in objs if tenant.pk])


@admin.register(Membership)
class MembershipAdmin(SubmitterPartAdmin):
    list_display = ["user", "tenant", "role"]
    list_filter = ["role", "tenant__tier"]
    list_select_related = ["user", "tenant"]
    search_fields = ["user__username", "tenant__slug"]
    raw_id_fields = ["user"]

    def drop(self, objs: list) -> None:
        """The users they name now and the ones their rows name still (a membership given to
        another user)."""
        saved = Membership.objects.filter(pk__in=[m.pk for m in objs if m.pk])
        users = {m.user_id for m in objs} | set(saved.values_list("user_id", flat=True))
        token_cache.revoked(user_ids=sorted(users))


@admin.register(Quota)
class QuotaAdmin(SubmitterPartAdmin):
    list_display = [
        "tenant",
        "max_queued_jobs",
        "max_gpus",
        "submit_rate_per_minute",
        "gpu_hours_per_period",
    ]
    list_select_related = ["tenant"]
    search_fields = ["tenant__slug"]

    def drop(self, objs: list) -> None:
        token_cache.tenants_changed(tenant_ids=[quota.tenant_id for quota in objs])


@admin.register(ApiToken)
class ApiTokenAdmin(admin.ModelAdmin):
    """Read only (the key is never stored): staff can see who holds which tokens, and revoke
    nothing here but through `manage.py revoke_token` or the owner's /tokens/ page."""

    list_display = [
        "user",
        "name",
        "prefix",
        "created_at",
        "expires_at",
        "last_used_at",
        "revoked_at",
    ]
    list_filter = ["revoked_at"]
    list_select_related = ["user"]
    search_fields = ["user__username", "name", "prefix"]

    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def delete_model(self, request, obj):
        token_cache.revoked(digests=[obj.digest])
        super().delete_model(request, obj)

    def delete_queryset(self, request, queryset):
        token_cache.revoked(digests=list(queryset.values_list("digest", flat=True)))
        super().delete_queryset(request, queryset)
