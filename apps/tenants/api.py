"""`/api/v1/usage/`: the caller's tenant: its limits and what it uses now."""

from django.db.models import Count
from rest_framework.exceptions import PermissionDenied
from rest_framework.response import Response
from rest_framework.views import APIView

from apps.admission.usage import admission_usage
from apps.jobs.access import membership_of
from apps.jobs.models import GpuAllocation, Job, JobState
from apps.jobs.services import tenant_limits


class UsageView(APIView):
    def get(self, request):
        membership = membership_of(request.user)
        if membership is None:
            raise PermissionDenied("you belong to no tenant")
        tenant = membership.tenant
        by_state = dict(
            Job.objects.filter(tenant=tenant, state__in=[JobState.QUEUED, JobState.STARTING, JobState.RUNNING])
            .values_list("state")
            .annotate(n=Count("pk"))
        )
        gpus_in_use = dict(
            GpuAllocation.objects.filter(attempt__job__tenant=tenant, released_at=None)
            .values_list("gpu__node__sku__name")
            .annotate(n=Count("pk"))
        )
        limits = tenant_limits(tenant)
        return Response(
            {
                "tenant": tenant.slug,
                "tier": tenant.tier.name,
                "role": membership.role,
                "limits": limits,
                "usage": {
                    "queued_jobs": by_state.get(JobState.QUEUED, 0),
                    "running_jobs": by_state.get(JobState.RUNNING, 0) + by_state.get(JobState.STARTING, 0),
                    "gpus_in_use": gpus_in_use,
                },
                # rate_limits (bucket state), gpu_hours (this period), gpu_caps: apps/admission/usage.py
                **admission_usage(tenant=tenant, user=request.user, limits=limits),
            }
        )
