"""The Content-Security-Policy middleware: django-csp's, with one exception.

DRF's browsable API (the HTML a browser gets from /api/) puts style attributes in its own
templates; its scripts are all static files. For those pages only, inline style is allowed;
script stays 'self' everywhere. Every other page (ours, the admin) gets the policy in
settings.CONTENT_SECURITY_POLICY as it is.
"""

from csp.middleware import CSPMiddleware, PolicyParts

BROWSABLE_API_STYLE = {"style-src": ["'unsafe-inline'"]}


class PlatformCSPMiddleware(CSPMiddleware):
    def get_policy_parts(self, request, response, report_only: bool = False) -> PolicyParts:
        parts = super().get_policy_parts(request, response, report_only)
        if request.path.startswith("/api/") and response.get("Content-Type", "").startswith(
            "text/html"
        ):
            parts.update = {**(parts.update or {}), **BROWSABLE_API_STYLE}
        return parts
