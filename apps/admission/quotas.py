"""Quotas held in the database: GPUs in use at once per tenant and SKU (checked by the
dispatcher, a job over the cap waits), and GPU-hours per period (checked at submit, 403).

The period is the calendar month in UTC: it starts at 00:00 UTC on the 1st. A GPU counts from
its allocation until its release (or now), clipped to the period.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from datetime import UTC, datetime

from django.db.models import Count, Q
from django.utils import timezone

from apps.admission.cache import follower_reason, queued_followers
from apps.admission.throttle import ArrayThrottle
from apps.jobs.models import GpuAllocation, Job, JobState
from apps.nodes.models import Node
from apps.platform.errors import GpuHoursExhausted
from apps.tenants.models import Quota, Tenant

# --- GPUs in use at once, per tenant and SKU ----------------------------------------------------


def gpu_cap_blocks(job: Job, in_use: dict[str, int], caps: dict[str, int], tenant_slug: str,
                   need: dict[str, int] | None = None) -> str | None:  # fmt: skip
    """Why `job` must wait for its tenant's GPU cap, or None. `in_use`: the tenant's GPUs held
    per SKU now; `caps`: its `Quota.max_gpus`; `need`: GPUs per SKU the job would take (by
    default its own SKU; a job naming none is checked once placed, against where it landed)."""
    if need is None:
        need = {job.gpu_sku.name: job.gpus * job.nodes} if job.gpu_sku_id and job.gpu_sku else {}
    for sku, wanted in sorted(need.items()):
        cap = caps.get(sku)
        if cap is None or wanted == 0:
            continue
        used = in_use.get(sku, 0)
        if wanted > cap:
            return f"tenant {tenant_slug}: needs {wanted} {sku} GPUs, more than its cap of {cap}"
        if used + wanted > cap:
            return f"tenant {tenant_slug}: {used} of {cap} {sku} GPUs in use"
    return None


def gpus_in_use(tenant_ids=None) -> dict[int, dict[str, int]]:
    """{tenant id: {SKU: GPUs held now}} from the live allocations."""
    rows = GpuAllocation.objects.filter(released_at=None)
    if tenant_ids is not None:
        rows = rows.filter(attempt__job__tenant_id__in=tenant_ids)
    use: dict[int, dict[str, int]] = defaultdict(dict)
    for tenant_id, sku, n in rows.values_list(
        "attempt__job__tenant_id", "gpu__node__sku__name"
    ).annotate(n=Count("pk")):
        use[tenant_id][sku] = n
    return use


@dataclass
class DispatchGate:
    """The dispatcher's admission view for one pass: which tenants have GPU caps, what they
    hold, and what this pass has placed so far (so two jobs of one tenant placed in the same
    pass cannot together pass the cap). Also holds coalesced followers back (see cache.py).

    The followers are read at the first `hold`, after the pass has read its queue, never with
    the rest at `load` (before it): a follower committed between the two reads was in the queue
    but not among the followers, and ran as a second execution of its origin (issue 36). A job
    is a follower from its insert's commit on, so a read after the queue's knows every follower
    in it."""

    caps: dict[int, dict[str, int]]
    slugs: dict[int, str]
    in_use: dict[int, dict[str, int]]
    node_skus: dict[str, str]
    # follower job id -> origin job id; None until the first `hold` reads them
    followers: dict | None = None
    throttle: ArrayThrottle = field(default_factory=ArrayThrottle)  # job arrays' %N

    @classmethod
    def load(cls) -> DispatchGate:
        capped = (
            Quota.objects.exclude(max_gpus={})
            .exclude(max_gpus__isnull=True)
            .select_related("tenant")
        )
        caps = {
            q.tenant_id: {k: int(v) for k, v in (q.max_gpus or {}).items()}
            for q in capped
            if q.max_gpus
        }
        return cls(
            caps=caps,
            slugs={q.tenant_id: q.tenant.slug for q in capped},
            in_use=gpus_in_use(list(caps)) if caps else {},
            node_skus=dict(Node.objects.values_list("name", "sku__name")) if caps else {},
            throttle=ArrayThrottle.load(),
        )

    def hold(self, job: Job, placement=None) -> bool:
        """True when `job` must not start now (its reason is set to say why). Called before
        the policy sees the queue, and again on each start with its placement, so jobs placed
        earlier in the same pass count."""
        reason = self.hold_reason(job, placement)
        if reason is None:
            return False
        reason = f"waiting: {reason}"[:300]
        if job.reason != reason:
            Job.objects.filter(pk=job.pk, state=JobState.QUEUED, version=job.version).update(
                reason=reason
            )
            job.reason = reason
        return True

    def hold_reason(self, job: Job, placement=None) -> str | None:
        if self.followers is None:
            self.followers = queued_followers()  # after the queue's read (see the class)
        if job.pk in self.followers:
            return follower_reason(job, origin_id=self.followers[job.pk])
        if (over := self.throttle.hold_reason(job)) is not None:
            return over
        caps = self.caps.get(job.tenant_id)
        if not caps:
            return None
        need = self._need(job, placement) if placement is not None else None
        return gpu_cap_blocks(
            job, self.in_use.get(job.tenant_id, {}), caps, self.slugs[job.tenant_id], need
        )

    def placed(self, job: Job, placement) -> None:
        """Count a start of this pass against its tenant's caps (and its array's %N)."""
        self.throttle.count(job)
        if job.tenant_id not in self.caps:
            return
        use = self.in_use.setdefault(job.tenant_id, {})
        for sku, n in self._need(job, placement).items():
            use[sku] = use.get(sku, 0) + n

    def _need(self, job: Job, placement) -> dict[str, int]:
        need: dict[str, int] = {}
        for assignment in placement.assignments:
            sku = self.node_skus.get(assignment.node) or (
                job.gpu_sku.name if job.gpu_sku_id and job.gpu_sku else ""
            )
            need[sku] = need.get(sku, 0) + len(assignment.gpu_indices)
        return need


# --- GPU-hours per period ------------------------------------------------------------------------


def period_bounds(now: datetime | None = None) -> tuple[datetime, datetime]:
    """The current quota period: the calendar month in UTC, [start, end)."""
    now = (now or timezone.now()).astimezone(UTC)
    start = now.replace(day=1, hour=0, minute=0, second=0, microsecond=0)
    end = (
        start.replace(year=start.year + 1, month=1)
        if start.month == 12
        else start.replace(month=start.month + 1)
    )
    return start, end


def gpu_hours_used(tenant: Tenant, now: datetime | None = None) -> float:
    """GPU-hours the tenant's attempts held in the current period, up to now."""
    now = now or timezone.now()
    start, _ = period_bounds(now)
    rows = GpuAllocation.objects.filter(attempt__job__tenant=tenant, allocated_at__lt=now).filter(
        Q(released_at=None) | Q(released_at__gt=start)
    )
    seconds = 0.0
    for allocated_at, released_at in rows.values_list("allocated_at", "released_at"):
        seconds += max(
            0.0, (min(released_at or now, now) - max(allocated_at, start)).total_seconds()
        )
    return seconds / 3600.0


@dataclass(frozen=True)
class GpuHours:
    used: float
    limit: int | None
    period_start: datetime
    resets_at: datetime

    def as_dict(self) -> dict:
        return {
            "used": round(self.used, 3), "limit": self.limit, "period": "calendar month (UTC)",
            "period_start": self.period_start.isoformat(), "resets_at": self.resets_at.isoformat(),
        }  # fmt: skip


def gpu_hours(tenant: Tenant, limits: dict, now: datetime | None = None) -> GpuHours:
    start, end = period_bounds(now)
    limit = limits.get("gpu_hours_per_period")
    used = gpu_hours_used(tenant, now)
    return GpuHours(used=used, limit=limit, period_start=start, resets_at=end)


def check_gpu_hours(*, tenant: Tenant, limits: dict, gpus_wanted: int) -> None:
    """403 when a GPU job arrives after the tenant has used its GPU-hours for the period."""
    if gpus_wanted == 0 or limits.get("gpu_hours_per_period") is None:
        return
    hours = gpu_hours(tenant, limits)
    if hours.limit is not None and hours.used >= hours.limit:
        raise GpuHoursExhausted(
            f"tenant {tenant.slug} has used {hours.used:.2f} of its {hours.limit} GPU-hours this period "
            f"(calendar month, UTC); the quota resets at {hours.resets_at.isoformat()}",
            field="gpu_hours",
        )
