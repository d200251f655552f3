"""`/api/v1/usage/`: the caller's tenant: its limits and what it uses now."""

from drf_spectacular.utils import extend_schema
from rest_framework.exceptions import PermissionDenied
from rest_framework.response import Response
from rest_framework.views import APIView

from apps.admission.quotas import period_bounds
from apps.admission.usage import admission_usage
from apps.jobs.access import membership_of
from apps.jobs.services import tenant_limits
from apps.jobs.usage import current_use
from apps.telemetry.read import utilization_usage

_COUNT = {"type": "integer", "minimum": 0}
_BUCKET = {
    "type": "object",
    "properties": {"rate_per_minute": {"type": "number"}, "burst": _COUNT, "remaining": _COUNT,
                   "seconds_to_full": {"type": "number"}},
}  # fmt: skip
USAGE_SCHEMA = {  # the answer below, for the OpenAPI document (gpuplatform/openapi.py)
    "type": "object",
    "required": [
        "tenant",
        "tier",
        "role",
        "limits",
        "usage",
        "rate_limits",
        "gpu_hours",
        "gpu_caps",
    ],
    "properties": {
        "tenant": {"type": "string"},
        "tier": {"type": "string"},
        "role": {"type": "string", "enum": ["admin", "member", "viewer"]},
        "limits": {
            "type": "object",
            "properties": {
                "max_queued_jobs": _COUNT,
                "max_gpus": {"type": "object", "additionalProperties": _COUNT},
                "submit_rate_per_minute": {"type": "number"},
                "submit_burst": _COUNT,
                "gpu_hours_per_period": {"type": "number", "nullable": True},
            },
        },
        "usage": {
            "type": "object",
            "properties": {
                "queued_jobs": _COUNT,
                "running_jobs": _COUNT,
                "gpus_in_use": {
                    "type": "object",
                    "additionalProperties": _COUNT,
                    "description": "per GPU SKU",
                },
            },
        },
        "rate_limits": {
            "type": "object",
            "description": "the submit buckets as they stand; `available: false` when Redis is down",
            "properties": {"available": {"type": "boolean"}, "tenant": _BUCKET, "user": _BUCKET},
            "required": ["available"],
        },
        "gpu_hours": {
            "type": "object",
            "properties": {
                "used": {"type": "number"},
                "limit": {"type": "number", "nullable": True},
                "period": {"type": "string"},
                "period_start": {"type": "string", "format": "date-time"},
                "resets_at": {"type": "string", "format": "date-time"},
            },
        },  # fmt: skip
        "gpu_caps": {
            "type": "object",
            "additionalProperties": {
                "type": "object",
                "properties": {"cap": _COUNT, "in_use": _COUNT},
            },
        },
        # GPU telemetry (docs/telemetry.md), over the same period as gpu_hours.
        "gpu_hours_allocated": {"type": "number"},
        "gpu_hours_utilized": {"type": "number", "description": "GPU-hours weighted by utilisation"},
        "gpu_efficiency": {"type": "number", "description": "utilized / allocated, 0..1"},
        "by_user": {"type": "array", "items": {"type": "object", "properties": {
            "user": {"type": "string"}, "gpu_hours_allocated": {"type": "number"},
            "gpu_hours_utilized": {"type": "number"}, "gpu_efficiency": {"type": "number"}}}},
    },
}  # fmt: skip


class UsageView(APIView):
    @extend_schema(responses={200: USAGE_SCHEMA})
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
                # gpu_hours_utilized, gpu_efficiency, by_user: apps/telemetry/read.py
                **utilization_usage(tenant, period_bounds()[0]),
            }
        )
