from django.contrib import admin, messages

from apps.nodes.credentials import credentials_changed
from apps.nodes.models import Gpu, GpuSku, Node, NodeCredential, NodeState
from apps.nodes.services import node_set_state
from apps.tenants.audit import AuditedAdmin, action_reason


@admin.register(GpuSku)
class GpuSkuAdmin(AuditedAdmin):
    list_display = ["name", "memory_mib", "description"]
    search_fields = ["name"]


class ShowsGpuHealth:
    @admin.display(description="health", ordering="health")
    def health_now(self, gpu: Gpu) -> str:
        """A GPU of a node given back (terminated) is gone, whatever its agent last reported
        (the report itself is kept as it came)."""
        if gpu.node.state == NodeState.TERMINATED:
            return "gone (node terminated)"
        return gpu.get_health_display()


class GpuInline(ShowsGpuHealth, admin.TabularInline):
    model = Gpu
    extra = 0
    fields = readonly_fields = (
        "index",
        "uuid",
        "memory_mib",
        "health_now",
        "utilization_percent",
        "memory_used_mib",
        "updated_at",
    )
    can_delete = False


def _set_state(state):
    def action(modeladmin, request, queryset):
        why = action_reason(request, f"state set to {state}")
        for node in queryset:
            node_set_state(node=node, state=state)
            modeladmin.audit(request, node, why)
        messages.info(request, f"{queryset.count()} node(s) now {state}")

    action.__name__ = f"make_{state}"
    action.short_description = f"Set state: {state}"
    action.allowed_permissions = ["change"]
    return action


@admin.register(Node)
class NodeAdmin(AuditedAdmin):
    list_display = [
        "name",
        "sku",
        "state",
        "isolation",
        "allow_unisolated_commands",
        "last_heartbeat_at",
        "hostname",
    ]
    list_filter = ["state", "sku", "isolation", "allow_unisolated_commands"]
    list_select_related = ["sku"]
    search_fields = ["name", "hostname"]
    readonly_fields = [
        "state",
        "isolation",
        "agent_instance",
        "last_heartbeat_at",
        "registered_at",
        "version",
    ]
    inlines = [GpuInline]
    actions = [
        _set_state(NodeState.CORDONED),
        _set_state(NodeState.DRAINING),
        _set_state(NodeState.READY),
    ]


@admin.register(NodeCredential)
class NodeCredentialAdmin(admin.ModelAdmin):
    """Issued with `manage.py create_node_credential NAME` (the secret is shown once, there);
    here only looked at, and revoked by setting "revoked at" (or `--revoke`)."""

    list_display = ["node_name", "key_id", "created_at", "expires_at", "revoked_at"]
    search_fields = ["node_name", "key_id"]
    readonly_fields = ["node_name", "key_id", "secret_sha256", "created_at"]

    def has_add_permission(self, request) -> bool:
        return False

    # A change here (revoked, a new expiry) or a delete reaches every web process's credential
    # cache (apps/nodes/credentials.py).
    def save_model(self, request, obj, form, change):
        super().save_model(request, obj, form, change)
        credentials_changed(key_ids=[obj.key_id])

    def delete_model(self, request, obj):
        credentials_changed(key_ids=[obj.key_id])
        super().delete_model(request, obj)

    def delete_queryset(self, request, queryset):
        credentials_changed(key_ids=list(queryset.values_list("key_id", flat=True)))
        super().delete_queryset(request, queryset)


@admin.register(Gpu)
class GpuAdmin(ShowsGpuHealth, admin.ModelAdmin):
    list_display = ["__str__", "uuid", "health_now", "utilization_percent", "memory_used_mib"]
    list_filter = ["health", "node__sku"]
    list_select_related = ["node"]
    search_fields = ["uuid", "node__name"]
    fields = readonly_fields = (
        "node",
        "index",
        "uuid",
        "memory_mib",
        "health_now",
        "utilization_percent",
        "memory_used_mib",
    )
