"""Django's 404 for a URL no route matches: JSON under `/api/` (as the API's own 404s, and as
its OpenAPI document says), the usual page elsewhere."""

from django.http import JsonResponse
from django.views.defaults import page_not_found


def not_found(request, exception=None):
    if request.path.startswith("/api/"):
        return JsonResponse({"detail": "Not found."}, status=404)
    return page_not_found(request, exception)
