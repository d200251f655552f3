from django.contrib.auth import views as auth_views
from django.templatetags.static import static
from django.urls import path
from django.views.generic import RedirectView

from apps.web import docs_page, prefixes, secrets_page, tokens, views


class FaviconRedirect(RedirectView):
    permanent = True

    def get_redirect_url(self, *args, **kwargs):
        return static("favicon.svg")  # at request time: the static storage's name for it


# The pages' names start "web-": the API's router names its routes "job-list", "secret-list" and
# so on, and its root (/api/v1/) reverses those names; a page of the same name would win.
urlpatterns = [
    path("login/", auth_views.LoginView.as_view(redirect_authenticated_user=True), name="login"),
    path("logout/", auth_views.LogoutView.as_view(), name="logout"),
    path("", views.dashboard, name="web-dashboard"),
    path("jobs/", views.job_list, name="web-job-list"),
    path("jobs/new/", views.job_new, name="web-job-new"),
    path("jobs/<uuid:job_id>/", views.job_detail, name="web-job-detail"),
    path("jobs/<uuid:job_id>/cancel/", views.job_cancel, name="web-job-cancel"),
    path("jobs/<uuid:job_id>/resubmit/", views.job_resubmit, name="web-job-resubmit"),
    path("jobs/<str:prefix>/", prefixes.job_by_prefix, name="web-job-by-prefix"),
    path("arrays/<uuid:array_id>/", views.array_detail, name="web-array-detail"),
    path("arrays/<str:prefix>/", prefixes.array_by_prefix, name="web-array-by-prefix"),
    path("arrays/<uuid:array_id>/cancel/", views.array_cancel, name="web-array-cancel"),
    path(
        "arrays/<uuid:array_id>/requeue-failed/",
        views.array_requeue_failed,
        name="web-array-requeue-failed",
    ),
    path("usage/", views.usage, name="web-usage-page"),
    path("tokens/", tokens.token_list, name="web-token-list"),
    path("tokens/<int:token_id>/revoke/", tokens.token_revoke, name="web-token-revoke"),
    path("secrets/", secrets_page.secret_list, name="web-secret-list"),
    path(
        "secrets/<str:name>/replace/", secrets_page.secret_replace_page, name="web-secret-replace"
    ),
    path("secrets/<str:name>/delete/", secrets_page.secret_delete_page, name="web-secret-delete"),
    path("docs/<str:name>/", docs_page.guide, name="web-guide"),
    # Browsers that ignore the pages' <link rel="icon"> ask for /favicon.ico.
    path("favicon.ico", FaviconRedirect.as_view(), name="web-favicon"),
]
