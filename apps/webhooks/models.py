"""Webhooks per tenant: where to tell a tenant's program that its jobs changed state, and the
log of every delivery (what was sent, how often, what came back)."""

import secrets

from django.db import models


def new_secret() -> str:
    return secrets.token_hex(32)


class Webhook(models.Model):
    tenant = models.ForeignKey("tenants.Tenant", on_delete=models.CASCADE, related_name="webhooks")
    url = models.URLField(
        max_length=500, help_text="http(s) URL that receives a POST per job state change."
    )
    secret = models.CharField(
        max_length=128, default=new_secret, help_text="HMAC-SHA256 key of the signature header."
    )
    active = models.BooleanField(default=True)
    cursor = models.BigIntegerField(
        default=0,
        help_text="Last audit event (JobEvent id) turned into deliveries; only later ones are sent.",
    )
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["tenant", "pk"]

    def __str__(self) -> str:
        return f"{self.tenant} -> {self.url}"


class DeliveryState(models.TextChoices):
    PENDING = "pending"
    DELIVERED = "delivered"
    FAILED = "failed"


class WebhookDelivery(models.Model):
    """One message to one webhook, retried with backoff until a 2xx or the last attempt."""

    webhook = models.ForeignKey(Webhook, on_delete=models.CASCADE, related_name="deliveries")
    event = models.ForeignKey("jobs.JobEvent", on_delete=models.CASCADE, related_name="+")
    payload = models.JSONField()
    state = models.CharField(
        max_length=16, choices=DeliveryState.choices, default=DeliveryState.PENDING
    )
    attempts = models.PositiveSmallIntegerField(default=0)
    next_attempt_at = models.DateTimeField(db_index=True)
    last_status_code = models.PositiveSmallIntegerField(null=True, blank=True)
    last_error = models.CharField(max_length=300, blank=True)
    delivered_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["-created_at", "-pk"]
        verbose_name_plural = "webhook deliveries"
        constraints = [
            models.UniqueConstraint(fields=["webhook", "event"], name="delivery_once_per_event")
        ]
        indexes = [models.Index(fields=["state", "next_attempt_at"])]

    def __str__(self) -> str:
        return f"delivery {self.pk} of event {self.event_id} to {self.webhook_id}"
