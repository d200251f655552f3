from django.contrib import admin
from django.urls import include, path
from drf_spectacular.views import SpectacularAPIView
from rest_framework.routers import DefaultRouter

from apps.bundles.api import BundleViewSet
from apps.jobs.api import ArrayViewSet, JobViewSet
from apps.jobs.catalog_api import TemplateViewSet
from apps.jobs.events_api import JobEventsView
from apps.nodes.api import CapacityView, NodeViewSet
from apps.secrets.api import SecretViewSet
from apps.tenants.api import UsageView
from apps.web.signin import PlatformAdminSite
from gpuplatform.health import healthz
from gpuplatform.metrics import metrics
from gpuplatform.sessions_api import JobSessionsView
from gpuplatform.terminal_page import terminal

# The admin can require a TOTP code from staff (GPUPLATFORM_STAFF_REQUIRE_2FA, apps/web/signin.py);
# the default site keeps its name and registrations, only its class changes.
admin.site.__class__ = PlatformAdminSite

router = DefaultRouter(trailing_slash=True)
router.include_format_suffixes = False  # artifact names like "result.json" are names, not formats
router.register("jobs", JobViewSet, basename="job")
router.register("nodes", NodeViewSet, basename="node")
router.register("bundles", BundleViewSet, basename="bundle")
router.register("secrets", SecretViewSet, basename="secret")
router.register("arrays", ArrayViewSet, basename="array")
router.register("templates", TemplateViewSet, basename="template")

urlpatterns = [
    path(
        "api/v1/jobs/<str:pk>/artifacts/<path:name>",
        JobViewSet.as_view({"get": "artifact"}),
        name="job-artifact-download",
    ),
    path("api/v1/jobs/<str:pk>/events/", JobEventsView.as_view(), name="job-events"),
    path("api/v1/jobs/<str:pk>/sessions/", JobSessionsView.as_view(), name="job-sessions"),
    path("api/v1/", include(router.urls)),
    path("api/v1/usage/", UsageView.as_view(), name="usage"),
    path("api/v1/capacity/", CapacityView.as_view(), name="capacity"),
    path("internal/agent/v1/", include("apps.nodes.agent_urls")),
    path("api/schema/", SpectacularAPIView.as_view(), name="schema"),
    path("healthz", healthz, name="healthz"),
    path("metrics", metrics, name="metrics"),
    path("admin/", admin.site.urls),
    path("jobs/<uuid:job_id>/terminal/", terminal, name="job-terminal"),
    path("", include("apps.web.urls")),
]

handler404 = "gpuplatform.not_found.not_found"  # JSON under /api/ (gpuplatform/not_found.py)
