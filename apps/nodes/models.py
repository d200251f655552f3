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
    agent_instance = models.CharField(
        max_length=64, blank=True, help_text="Id of the agent run now serving it."
    )
    last_heartbeat_at = models.DateTimeField(null=True, blank=True)
    drain_deadline = models.DateTimeField(
        null=True,
        blank=True,
        help_text="Draining: jobs still running then are preempted (and resume elsewhere).",
    )
    registered_at = models.DateTimeField(auto_now_add=True)
    version = models.PositiveIntegerField(default=0)
    isolation = models.CharField(
        max_length=64, default="none",
        help_text='How its agent fences jobs from each other and from itself, as the agent reports it; "none": it '
                  "cannot (not root, no cgroups), and jobs that may run arbitrary commands are not placed here.",
    )  # fmt: skip
    allow_unisolated_commands = models.BooleanField(
        default=False,
        help_text="Operator opt-in: place jobs that may run arbitrary commands here even though its agent cannot "
                  'isolate them (isolation "none"). Such a job can read what the agent can. '
                  "GPUPLATFORM_TRUST_UNISOLATED_NODES=1 (set by `make run`) opts in every node.",
    )  # fmt: skip

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
        constraints = [
            models.UniqueConstraint(fields=["node", "index"], name="gpu_unique_index_per_node")
        ]
        verbose_name = "GPU"

    def __str__(self) -> str:
        return f"{self.node.name}:{self.index}"


class NodeCredential(models.Model):
    """A node agent's key to the agent API (docs/architecture.md, "Agent API"). Only a hash of its
    secret is stored; `key_id` finds the row. Issued and revoked by `manage.py create_node_credential`."""

    node_name = models.CharField(
        max_length=64, db_index=True, help_text="The only node this credential acts as."
    )
    key_id = models.CharField(max_length=32, unique=True)
    secret_sha256 = models.CharField(max_length=64)
    created_at = models.DateTimeField(auto_now_add=True)
    expires_at = models.DateTimeField(null=True, blank=True)
    revoked_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["node_name", "-created_at"]

    def __str__(self) -> str:
        return f"{self.node_name} ({self.key_id})"
