"""Read-only figures about a tenant's jobs now, shared by the usage API and the usage page
(here, not in apps/tenants: tenants sit below jobs)."""

from dataclasses import dataclass

from django.db.models import Count

from apps.jobs.models import GpuAllocation, Job, JobState
from apps.tenants.models import Tenant


@dataclass(frozen=True)
class CurrentUse:
    queued_jobs: int
    running_jobs: int  # starting or running
    gpus_in_use: dict[str, int]  # by SKU


def current_use(tenant: Tenant) -> CurrentUse:
    by_state = dict(
        Job.objects.filter(
            tenant=tenant, state__in=[JobState.QUEUED, JobState.STARTING, JobState.RUNNING]
        )
        .values_list("state")
        .annotate(n=Count("pk"))
    )
    gpus_in_use = dict(
        GpuAllocation.objects.filter(attempt__job__tenant=tenant, released_at=None)
        .values_list("gpu__node__sku__name")
        .annotate(n=Count("pk"))
    )
    running = by_state.get(JobState.RUNNING, 0) + by_state.get(JobState.STARTING, 0)
    return CurrentUse(
        queued_jobs=by_state.get(JobState.QUEUED, 0), running_jobs=running, gpus_in_use=gpus_in_use
    )
