"""Who may submit what: tiers, tenants, their members and their quotas."""

from django.conf import settings
from django.db import models


class IdleAction(models.TextChoices):
    NONE = "none"
    REQUEUE = "requeue"
    CANCEL = "cancel"


class Tier(models.Model):
    """A service tier. `rank` orders tiers for "may a tenant submit at this tier"; `level` is the
    strict priority level (higher first) and `weight` the fair share inside one level."""

    name = models.SlugField(max_length=32, unique=True)
    rank = models.PositiveSmallIntegerField(unique=True, help_text="Higher is a better tier.")
    level = models.PositiveSmallIntegerField(
        default=0, help_text="Strict priority level; higher first."
    )
    weight = models.PositiveIntegerField(default=1, help_text="Fair-share weight within its level.")
    preemptible = models.BooleanField(default=True, help_text="Its jobs may be preempted.")
    can_preempt = models.BooleanField(default=False, help_text="Its jobs may preempt lower tiers.")
    max_queued_jobs = models.PositiveIntegerField(default=100)
    submit_rate_per_minute = models.PositiveIntegerField(default=60)
    submit_burst = models.PositiveIntegerField(default=20)
    preemption_grace_seconds = models.PositiveIntegerField(default=30)
    # Fair-share policy settings (docs/scheduling.md has the formulas).
    guaranteed_share = models.FloatField(
        default=0.0, help_text="Fraction of all GPUs it may reclaim by preemption."
    )
    borrowing_limit = models.FloatField(
        null=True,
        blank=True,
        help_text="Fraction above its guarantee it may hold; empty: no limit.",
    )
    age_limit_seconds = models.PositiveIntegerField(
        default=24 * 3600,
        help_text="A job waiting this long goes ahead of every younger job of its level.",
    )
    min_runtime_seconds = models.PositiveIntegerField(
        default=15 * 60, help_text="A job must run this long before it may be preempted."
    )
    max_preemptions = models.PositiveSmallIntegerField(
        default=3, help_text="A job is preempted at most this often."
    )
    preempt_wait_seconds = models.PositiveIntegerField(
        default=0,
        help_text="Wait instead of preempting when the autoscaler brings a fitting node this soon.",
    )
    interactive_idle_minutes = models.PositiveIntegerField(
        default=30,
        help_text="An interactive job with nothing typed or printed this long ends (its GPUs free).",
    )
    bundle_max_mib = models.PositiveIntegerField(
        default=100, help_text="Largest code bundle its tenants may upload, MiB."
    )
    # Idle GPUs (docs/telemetry.md): warn after this long with every GPU of a job idle, then
    # act (requeue from the checkpoint, or cancel); None: never. Minutes of
    # GPUPLATFORM_GPU_IDLE_MINUTE_SECONDS (60).
    gpu_idle_warn_minutes = models.PositiveIntegerField(
        null=True, blank=True, help_text="Warn after its GPUs sat idle this long; empty: never."
    )
    gpu_idle_minutes = models.PositiveIntegerField(
        null=True, blank=True, help_text="Act after its GPUs sat idle this long; empty: never."
    )
    gpu_idle_action = models.CharField(
        max_length=8, choices=IdleAction.choices, default=IdleAction.NONE,
        help_text="What happens to a job whose GPUs sat idle for gpu_idle_minutes.",
    )  # fmt: skip
    description = models.CharField(max_length=200, blank=True)

    class Meta:
        ordering = ["-rank"]

    def __str__(self) -> str:
        return self.name


class Tenant(models.Model):
    slug = models.SlugField(max_length=64, unique=True)
    name = models.CharField(max_length=200, blank=True)
    tier = models.ForeignKey(Tier, on_delete=models.PROTECT, related_name="tenants")
    allow_commands = models.BooleanField(
        default=False, help_text="May submit arbitrary argv commands, not only templates."
    )
    bundle_max_mib = models.PositiveIntegerField(
        null=True, blank=True, help_text="Largest code bundle, MiB; empty: the tier's."
    )
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["slug"]

    def __str__(self) -> str:
        return self.slug

    @property
    def bundle_cap_bytes(self) -> int:
        """The largest bundle it may upload: its own cap, else its tier's."""
        mib = self.bundle_max_mib if self.bundle_max_mib is not None else self.tier.bundle_max_mib
        return mib * 1024 * 1024


class Role(models.TextChoices):
    ADMIN = "admin", "Tenant admin"
    MEMBER = "member", "Member"
    VIEWER = "viewer", "Viewer"


class Membership(models.Model):
    """A user's place in a tenant. One tenant per user in v1 (see docs/architecture.md)."""

    user = models.OneToOneField(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="membership"
    )
    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="memberships")
    role = models.CharField(max_length=16, choices=Role.choices, default=Role.MEMBER)

    def __str__(self) -> str:
        return f"{self.user} in {self.tenant} ({self.role})"

    @property
    def can_submit(self) -> bool:
        return self.role in (Role.ADMIN, Role.MEMBER)


class Quota(models.Model):
    """A tenant's own limits; an empty field falls back to the tier's."""

    tenant = models.OneToOneField(Tenant, on_delete=models.CASCADE, related_name="quota")
    max_queued_jobs = models.PositiveIntegerField(null=True, blank=True)
    max_gpus = models.JSONField(
        default=dict,
        blank=True,
        help_text='Most GPUs in use at once per SKU, e.g. {"H100-80GB": 16}.',
    )
    submit_rate_per_minute = models.PositiveIntegerField(null=True, blank=True)
    submit_burst = models.PositiveIntegerField(null=True, blank=True)
    gpu_hours_per_period = models.PositiveIntegerField(null=True, blank=True)

    def __str__(self) -> str:
        return f"quota of {self.tenant}"

    def effective(self) -> dict:
        tier = self.tenant.tier
        return {
            "max_queued_jobs": self.max_queued_jobs
            if self.max_queued_jobs is not None
            else tier.max_queued_jobs,
            "max_gpus": dict(self.max_gpus or {}),
            "submit_rate_per_minute": self.submit_rate_per_minute or tier.submit_rate_per_minute,
            "submit_burst": self.submit_burst or tier.submit_burst,
            "gpu_hours_per_period": self.gpu_hours_per_period,
        }


class ApiToken(models.Model):
    """An API token, kept as the SHA-256 of its key: the key itself is shown once, when made.

    A plain SHA-256 is enough here (no slow password hash): the key is 32 random bytes, so there
    is nothing to guess a dictionary from, and the lookup stays one indexed equality on the
    submit path. Keys start with `gpp_` so that secret scanners can recognise a leaked one
    (tokens carried over from DRF's table keep their old 40-hex keys until they expire)."""

    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="api_tokens"
    )
    name = models.CharField(
        max_length=64, help_text="The owner's label; one active token per name."
    )
    prefix = models.CharField(
        max_length=16, help_text="The key's first characters, to recognise it by."
    )
    digest = models.CharField(max_length=64, unique=True, help_text="SHA-256 of the key, hex.")
    created_at = models.DateTimeField(auto_now_add=True)
    expires_at = models.DateTimeField(null=True, blank=True, help_text="Empty: never expires.")
    last_used_at = models.DateTimeField(null=True, blank=True, help_text="Kept to the minute.")
    revoked_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at"]
        constraints = [
            models.UniqueConstraint(
                fields=["user", "name"],
                condition=models.Q(revoked_at__isnull=True),
                name="one_active_token_per_name",
            )
        ]

    def __str__(self):
        return f"{self.name} ({self.prefix}…)"
