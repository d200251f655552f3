from django.contrib import admin

from apps.tenants.models import Membership, Quota, Tenant, Tier


@admin.register(Tier)
class TierAdmin(admin.ModelAdmin):
    list_display = ["name", "rank", "level", "weight", "preemptible", "can_preempt", "max_queued_jobs", "submit_rate_per_minute"]
    search_fields = ["name"]


class QuotaInline(admin.StackedInline):
    model = Quota
    can_delete = False


@admin.register(Tenant)
class TenantAdmin(admin.ModelAdmin):
    list_display = ["slug", "name", "tier", "allow_commands", "created_at"]
    list_filter = ["tier", "allow_commands"]
    list_select_related = ["tier"]
    search_fields = ["slug", "name"]
    inlines = [QuotaInline]


@admin.register(Membership)
class MembershipAdmin(admin.ModelAdmin):
    list_display = ["user", "tenant", "role"]
    list_filter = ["role", "tenant__tier"]
    list_select_related = ["user", "tenant"]
    search_fields = ["user__username", "tenant__slug"]
    raw_id_fields = ["user"]


@admin.register(Quota)
class QuotaAdmin(admin.ModelAdmin):
    list_display = ["tenant", "max_queued_jobs", "max_gpus", "submit_rate_per_minute", "gpu_hours_per_period"]
    list_select_related = ["tenant"]
    search_fields = ["tenant__slug"]
