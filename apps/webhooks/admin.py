from django import forms
from django.contrib import admin, messages

from apps.webhooks.guard import WebhookRefused
from apps.webhooks.models import Webhook, WebhookDelivery
from apps.webhooks.services import MAX_URL, check_url, webhook_create


class WebhookForm(forms.ModelForm):
    """Support staff add a tenant's webhook here (the usage page sends tenants to them). The URL
    gets `create_webhook`'s check, `check_url`, shown next to the field: the URL as typed (no
    scheme assumed), http(s), a host that resolves only to addresses the guard allows."""

    url = forms.CharField(
        max_length=MAX_URL, help_text=Webhook._meta.get_field("url").help_text,
        widget=forms.URLInput(attrs={"class": "vURLField"}),
    )  # fmt: skip

    class Meta:
        model = Webhook
        fields = ["tenant", "url", "active"]

    def clean_url(self):
        url = self.cleaned_data["url"]
        try:
            check_url(url)
        except WebhookRefused as refused:
            raise forms.ValidationError(str(refused)) from None
        return url


@admin.register(Webhook)
class WebhookAdmin(admin.ModelAdmin):
    form = WebhookForm
    list_display = ["tenant", "url", "active", "created_at"]
    list_filter = ["active"]
    list_select_related = ["tenant"]
    search_fields = ["tenant__slug", "url"]
    readonly_fields = ["secret", "cursor", "created_at"]

    def get_fields(self, request, obj=None):
        if obj is None:  # its secret and cursor are made on save (webhook_create), shown after
            return ["tenant", "url", "active"]
        return super().get_fields(request, obj)

    def save_model(self, request, obj, form, change):
        if change:
            super().save_model(request, obj, form, change)
            return
        created = webhook_create(tenant=obj.tenant, url=obj.url)
        if not obj.active:  # made paused, as the form asked
            Webhook.objects.filter(pk=created.pk).update(active=False)
        obj.pk, obj.secret, obj.cursor = created.pk, created.secret, created.cursor
        messages.info(
            request,
            "The webhook hears about state changes from now on; its secret is shown on its page.",
        )


@admin.register(WebhookDelivery)
class WebhookDeliveryAdmin(admin.ModelAdmin):
    """The delivery log: read only. `last_error` is in the platform's words (never a receiver's
    body); tenants see only the status code (on /usage/)."""

    list_display = ["created_at", "webhook", "event_id", "state", "attempts", "last_status_code", "last_error",
                    "next_attempt_at", "delivered_at"]  # fmt: skip
    list_filter = ["state"]
    list_select_related = ["webhook__tenant"]
    search_fields = ["webhook__url", "webhook__tenant__slug"]

    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False
