"""The GPU fleet: SKUs, nodes and their GPUs, as the node agents report them."""

from django.db import models


class GpuSku(models.Model):
    name = models.CharField(max_length=64, unique=True, help_text='e.g. "H100-80GB"')
    memory_mib = models.PositiveIntegerField(default=0)
    description = models.CharField(max_length=200, blank=True)

    class Meta:
        ordering = ["name"]
        verbose_name = "GPU SKU"

    def __str__(self) -> str:
        return self.name


class NodeState(models.TextChoices):
    READY = "ready"
    CORDONED = "cordoned"
    DRAINING = "draining"
    LOST = "lost"
    TERMINATED = "terminated"  # given back by the autoscaler's provider


class Node(models.Model):
    name = models.CharField(max_length=64, unique=True)
    sku = models.ForeignKey(GpuSku, on_delete=models.PROTECT, related_name="nodes")
    state = models.CharField(max_length=16, choices=NodeState.choices, default=NodeState.READY)
    labels = models.JSONField(default=dict, blank=True)
    hostname = models.CharField(max_length=255, blank=True)
    agent_instance = models.CharField(max_length=64, blank=True, help_text="Id of the agent run now serving it.")
    last_heartbeat_at = models.DateTimeField(null=True, blank=True)
    drain_deadline = models.DateTimeField(
        null=True, blank=True, help_text="Draining: jobs still running then are preempted (and resume elsewhere)."
    )
    registered_at = models.DateTimeField(auto_now_add=True)
    version = models.PositiveIntegerField(default=0)

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name

    @property
    def queue(self) -> str:
        return f"node.{self.name}"


class GpuHealth(models.TextChoices):
    HEALTHY = "healthy"
    UNHEALTHY = "unhealthy"


class Gpu(models.Model):
    node = models.ForeignKey(Node, on_delete=models.CASCADE, related_name="gpus")
    index = models.PositiveSmallIntegerField()
    uuid = models.CharField(max_length=80)
    memory_mib = models.PositiveIntegerField(default=0)
    health = models.CharField(max_length=16, choices=GpuHealth.choices, default=GpuHealth.HEALTHY)
    utilization_percent = models.PositiveSmallIntegerField(null=True, blank=True)
    memory_used_mib = models.PositiveIntegerField(null=True, blank=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["node", "index"]
        constraints = [models.UniqueConstraint(fields=["node", "index"], name="gpu_unique_index_per_node")]
        verbose_name = "GPU"

    def __str__(self) -> str:
        return f"{self.node.name}:{self.index}"
