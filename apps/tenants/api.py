"""`/api/v1/usage/`: the caller's tenant: its limits and what it uses now."""

from rest_framework.exceptions import PermissionDenied
from rest_framework.response import Response
from rest_framework.views import APIView

from apps.admission.usage import admission_usage
from apps.jobs.access import membership_of
from apps.jobs.services import tenant_limits
from apps.jobs.usage import current_use


class UsageView(APIView):
    def get(self, request):
        membership = membership_of(request.user)
        if membership is None:
            raise PermissionDenied("you belong to no tenant")
        tenant = membership.tenant
        use = current_use(tenant)
        limits = tenant_limits(tenant)
        return Response(
            {
                "tenant": tenant.slug,
                "tier": tenant.tier.name,
                "role": membership.role,
                "limits": limits,
                "usage": {
                    "queued_jobs": use.queued_jobs,
                    "running_jobs": use.running_jobs,
                    "gpus_in_use": use.gpus_in_use,
                },
                # rate_limits (bucket state), gpu_hours (this period), gpu_caps: apps/admission/usage.py
                **admission_usage(tenant=tenant, user=request.user, limits=limits),
            }
        )
