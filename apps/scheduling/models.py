"""Autoscaling records: the per-SKU policy support staff edit, the provider's node requests, and
the log of decisions with their reasons (shown in the admin and in /metrics)."""

from django.db import models


class AutoscaleMode(models.TextChoices):
    OFF = "off"
    REACTIVE = "reactive"
    PREDICTIVE = "predictive"


class AutoscalePolicy(models.Model):
    sku = models.OneToOneField("nodes.GpuSku", on_delete=models.CASCADE, related_name="autoscale")
    mode = models.CharField(max_length=16, choices=AutoscaleMode.choices, default=AutoscaleMode.OFF)
    gpus_per_node = models.PositiveSmallIntegerField(default=8)
    min_nodes = models.PositiveIntegerField(default=0)
    max_nodes = models.PositiveIntegerField(default=4)
    cooldown_seconds = models.PositiveIntegerField(
        default=600, help_text="Idle this long before a node goes."
    )
    provision_lag_seconds = models.PositiveIntegerField(
        default=300, help_text="How long a new node takes to arrive."
    )
    gpu_hour_budget = models.PositiveIntegerField(
        null=True, blank=True, help_text="Per calendar month; empty: none."
    )
    labels = models.JSONField(default=dict, blank=True, help_text="Labels for the nodes it adds.")

    class Meta:
        verbose_name_plural = "autoscale policies"

    def __str__(self) -> str:
        return f"autoscale {self.sku} ({self.mode})"

    def clean(self):
        from django.core.exceptions import ValidationError

        if self.min_nodes > self.max_nodes:
            raise ValidationError({"min_nodes": "must not exceed max_nodes"})


class ProvisionState(models.TextChoices):
    PENDING = "pending"  # asked for, arriving after the lag
    RUNNING = "running"  # its agent was started
    TERMINATED = "terminated"
    FAILED = "failed"


class ProvisionRequest(models.Model):
    sku = models.ForeignKey(
        "nodes.GpuSku", on_delete=models.CASCADE, related_name="provision_requests"
    )
    node_name = models.CharField(max_length=64, unique=True)
    provider = models.CharField(max_length=32)
    state = models.CharField(
        max_length=16, choices=ProvisionState.choices, default=ProvisionState.PENDING
    )
    gpus = models.PositiveSmallIntegerField()
    requested_at = models.DateTimeField(auto_now_add=True)
    ready_at = models.DateTimeField(help_text="When the node is expected (requested + lag).")
    pid = models.IntegerField(null=True, blank=True)
    ended_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-requested_at"]

    def __str__(self) -> str:
        return f"{self.node_name} ({self.state})"


class ScaleEvent(models.Model):
    sku = models.ForeignKey("nodes.GpuSku", on_delete=models.CASCADE, related_name="scale_events")
    created_at = models.DateTimeField(auto_now_add=True, db_index=True)
    current = models.PositiveIntegerField()
    pending = models.PositiveIntegerField()
    desired = models.PositiveIntegerField()
    provision = models.PositiveIntegerField(default=0)
    drain = models.JSONField(default=list, blank=True)
    terminate = models.JSONField(default=list, blank=True)
    reason = models.CharField(max_length=500)

    class Meta:
        ordering = ["-created_at"]

    def __str__(self) -> str:
        return f"{self.sku}: {self.current}+{self.pending} -> {self.desired}"
