"""What admission remembers between requests: idempotency keys, the result cache's links
between identical jobs, per-template cache lifetimes, and counters of Redis outages."""

from django.db import models
from django.utils import timezone


class IdempotencyKey(models.Model):
    """A client's `Idempotency-Key`, scoped to its tenant. The unique constraint is what makes
    concurrent replays exact: only one insert of (tenant, key) can ever win."""

    tenant = models.ForeignKey(
        "tenants.Tenant", on_delete=models.CASCADE, related_name="idempotency_keys"
    )
    key = models.CharField(max_length=255)
    body_sha256 = models.CharField(max_length=64)
    job = models.ForeignKey("jobs.Job", on_delete=models.CASCADE, related_name="+")
    created_at = models.DateTimeField(default=timezone.now, db_index=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["tenant", "key"], name="idempotency_key_once_per_tenant"
            )
        ]

    def __str__(self) -> str:
        return f"{self.tenant_id}:{self.key}"


ONE_ACTIVE_ORIGIN = "cache_one_active_origin_per_key"


class CacheRole(models.TextChoices):
    ORIGIN = "origin"  # runs on a GPU; its result feeds later hits
    FOLLOWER = "follower"  # joined an identical origin while it was queued or running
    HIT = "hit"  # served from a finished origin's result, never ran


class CachedJob(models.Model):
    """A cacheable job's place in the result cache. `key` hashes template, template version,
    params and tenant, so nothing is ever shared across tenants or template versions.

    `active`: an origin whose job is queued or placed (its end clears it, in the same
    transaction). The partial unique index on (tenant, key) of the active origins is what makes
    coalescing exact: of two submits that would each start an identical job, only one insert
    can win; the other's transaction is run again and joins the winner as a follower
    (apps/admission/services.py, docs/reliability.md "Concurrency")."""

    job = models.OneToOneField(
        "jobs.Job", on_delete=models.CASCADE, primary_key=True, related_name="cache_link"
    )
    tenant = models.ForeignKey("tenants.Tenant", on_delete=models.CASCADE, related_name="+")
    key = models.CharField(max_length=64)
    role = models.CharField(max_length=16, choices=CacheRole.choices)
    source = models.ForeignKey(
        "jobs.Job", null=True, blank=True, on_delete=models.SET_NULL, related_name="cache_dependents",
        help_text="The origin a follower joined or a hit was served from.",
    )  # fmt: skip
    created_at = models.DateTimeField(auto_now_add=True)
    active = models.BooleanField(default=False)

    class Meta:
        indexes = [models.Index(fields=["tenant", "key", "role"])]
        constraints = [
            models.UniqueConstraint(
                fields=["tenant", "key"],
                condition=models.Q(role="origin", active=True),
                name=ONE_ACTIVE_ORIGIN,
            )
        ]

    def __str__(self) -> str:
        return f"{self.role} {self.job_id}"


class TemplateCachePolicy(models.Model):
    """How long a template's results may be served from cache (settings' default otherwise)."""

    template = models.OneToOneField(
        "jobs.JobTemplate", on_delete=models.CASCADE, related_name="cache_policy"
    )
    ttl_seconds = models.PositiveIntegerField(help_text="0 turns the cache off for this template.")

    def __str__(self) -> str:
        return f"{self.template} cached {self.ttl_seconds}s"


class AdmissionCounter(models.Model):
    """Counters every web process shares (the database is the one place they all see), e.g.
    submissions admitted or refused while Redis was down."""

    name = models.CharField(max_length=100, unique=True)
    value = models.PositiveBigIntegerField(default=0)
    updated_at = models.DateTimeField(auto_now=True)

    def __str__(self) -> str:
        return f"{self.name}={self.value}"


class QueuedCount(models.Model):
    """How many jobs a tenant has queued. Kept by triggers on the jobs table, in the same
    transaction as every change that puts a job in the queue or takes it out (whatever makes
    it: a submit, the dispatcher, a cancel, the admin, raw SQL), so it is exact whenever the
    table is; apps/admission/queued.py installs them and documents why. The queued-job cap
    reads it instead of counting the queue (which grew with it), and a submit on PostgreSQL
    takes this row's lock to check the cap and insert its job in one statement. A tenant with
    no row has no job queued (the first one creates it)."""

    tenant = models.OneToOneField("tenants.Tenant", on_delete=models.CASCADE, primary_key=True,
                                  related_name="queued_count")  # fmt: skip
    queued = models.IntegerField(default=0)

    def __str__(self) -> str:
        return f"{self.tenant_id}: {self.queued} queued"
