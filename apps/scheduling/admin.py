from django.contrib import admin

from apps.scheduling.models import AutoscalePolicy, ProvisionRequest, ScaleEvent


@admin.register(AutoscalePolicy)
class AutoscalePolicyAdmin(admin.ModelAdmin):
    list_display = [
        "sku",
        "mode",
        "gpus_per_node",
        "min_nodes",
        "max_nodes",
        "provision_lag_seconds",
        "cooldown_seconds",
    ]
    list_select_related = ["sku"]


@admin.register(ProvisionRequest)
class ProvisionRequestAdmin(admin.ModelAdmin):
    list_display = ["node_name", "sku", "provider", "state", "requested_at", "ready_at", "ended_at"]
    list_filter = ["state", "sku", "provider"]
    list_select_related = ["sku"]
    readonly_fields = [
        "sku",
        "node_name",
        "provider",
        "state",
        "gpus",
        "requested_at",
        "ready_at",
        "pid",
        "ended_at",
    ]

    def has_add_permission(self, request):
        return False


@admin.register(ScaleEvent)
class ScaleEventAdmin(admin.ModelAdmin):
    """The autoscaler's decisions with their reasons: read only."""

    list_display = ["created_at", "sku", "current", "pending", "desired", "provision", "reason"]
    list_filter = ["sku"]
    list_select_related = ["sku"]

    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False
