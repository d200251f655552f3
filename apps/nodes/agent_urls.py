"""`/internal/agent/v1/`: the node agents' API (apps/nodes/agent_api.py)."""

from django.urls import path

from apps.nodes import agent_api as views
from apps.nodes import agent_reports as reports
from apps.nodes.agent_images import ImageView
from apps.nodes.agent_sessions import SessionActivityView

member = "members/<int:attempt_id>/<int:rank>/"
urlpatterns = [
    path("register/", views.RegisterView.as_view(), name="agent-register"),
    path("heartbeat/", views.HeartbeatView.as_view(), name="agent-heartbeat"),
    path("assignments/", views.AssignmentsView.as_view(), name="agent-assignments"),
    path("reports/", reports.ReportsView.as_view(), name="agent-reports"),
    path(member, views.MemberView.as_view(), name="agent-member"),
    path(member + "started/", reports.StartedView.as_view(), name="agent-started"),
    path(member + "progress/", reports.ProgressView.as_view(), name="agent-progress"),
    path(member + "finished/", reports.FinishedView.as_view(), name="agent-finished"),
    path(member + "lost/", reports.LostView.as_view(), name="agent-lost"),
    path(member + "log/", views.LogView.as_view(), name="agent-log"),
    path(member + "secrets/", views.SecretsView.as_view(), name="agent-secrets"),
    path(member + "checkpoint/", views.CheckpointView.as_view(), name="agent-checkpoint"),
    path(member + "bundle/", views.BundleView.as_view(), name="agent-bundle"),
    path(member + "artifacts/<path:name>", views.ArtifactView.as_view(), name="agent-artifact"),
    path(member + "image/", ImageView.as_view(), name="agent-image"),
    path(member + "inputs/", views.InputsView.as_view(), name="agent-inputs"),
    path(member + "activity/", SessionActivityView.as_view(), name="agent-session-activity"),
    path(
        member + "inputs/<uuid:job_id>/<path:name>", views.InputView.as_view(), name="agent-input"
    ),
]
