from django.contrib.auth import views as auth_views
from django.urls import path

from apps.web import secrets_page, tokens, views

urlpatterns = [
    path("login/", auth_views.LoginView.as_view(redirect_authenticated_user=True), name="login"),
    path("logout/", auth_views.LogoutView.as_view(), name="logout"),
    path("", views.dashboard, name="dashboard"),
    path("jobs/", views.job_list, name="job-list"),
    path("jobs/new/", views.job_new, name="job-new"),
    path("jobs/<uuid:job_id>/", views.job_detail, name="job-detail"),
    path("jobs/<uuid:job_id>/cancel/", views.job_cancel, name="job-cancel"),
    path("jobs/<uuid:job_id>/resubmit/", views.job_resubmit, name="job-resubmit"),
    path("arrays/<uuid:array_id>/", views.array_detail, name="array-detail"),
    path("arrays/<uuid:array_id>/cancel/", views.array_cancel, name="array-cancel"),
    path(
        "arrays/<uuid:array_id>/requeue-failed/",
        views.array_requeue_failed,
        name="array-requeue-failed",
    ),
    path("usage/", views.usage, name="usage-page"),
    path("tokens/", tokens.token_list, name="token-list"),
    path("tokens/<int:token_id>/revoke/", tokens.token_revoke, name="token-revoke"),
    path("secrets/", secrets_page.secret_list, name="secret-list"),
    path("secrets/<str:name>/replace/", secrets_page.secret_replace_page, name="secret-replace"),
    path("secrets/<str:name>/delete/", secrets_page.secret_delete_page, name="secret-delete"),
]
