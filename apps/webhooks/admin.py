from django.contrib import admin, messages

from apps.webhooks.models import Webhook, WebhookDelivery
from apps.webhooks.services import webhook_create


@admin.register(Webhook)
class WebhookAdmin(admin.ModelAdmin):
    list_display = ["tenant", "url", "active", "created_at"]
    list_filter = ["active"]
    list_select_related = ["tenant"]
    search_fields = ["tenant__slug", "url"]
    readonly_fields = ["secret", "cursor", "created_at"]

    def save_model(self, request, obj, form, change):
        if change:
            super().save_model(request, obj, form, change)
            return
        created = webhook_create(tenant=obj.tenant, url=obj.url)
        obj.pk, obj.secret, obj.cursor = created.pk, created.secret, created.cursor
        messages.info(request, "The webhook hears about state changes from now on; its secret is shown on its page.")


@admin.register(WebhookDelivery)
class WebhookDeliveryAdmin(admin.ModelAdmin):
    """The delivery log: read only."""

    list_display = ["created_at", "webhook", "event_id", "state", "attempts", "last_status_code", "last_error",
                    "next_attempt_at", "delivered_at"]  # fmt: skip
    list_filter = ["state"]
    list_select_related = ["webhook__tenant"]
    search_fields = ["webhook__url", "webhook__tenant__slug"]

    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False
