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


@admin.register(Tier)
class TierAdmin(AuditedAdmin):
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


class QuotaInline(admin.StackedInline):
    model = Quota
    can_delete = False


@admin.register(Tenant)
class TenantAdmin(AuditedAdmin):
    list_display = ["slug", "name", "tier", "allow_commands", "created_at"]
    list_filter = ["tier", "allow_commands"]
    list_select_related = ["tier"]
    search_fields = ["slug", "name"]
    inlines = [QuotaInline]


@admin.register(Membership)
class MembershipAdmin(AuditedAdmin):
    list_display = ["user", "tenant", "role"]
    list_filter = ["role", "tenant__tier"]
    list_select_related = ["user", "tenant"]
    search_fields = ["user__username", "tenant__slug"]
    raw_id_fields = ["user"]


@admin.register(Quota)
class QuotaAdmin(AuditedAdmin):
    list_display = [
        "tenant",
        "max_queued_jobs",
        "max_gpus",
        "submit_rate_per_minute",
        "gpu_hours_per_period",
    ]
    list_select_related = ["tenant"]
    search_fields = ["tenant__slug"]


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
