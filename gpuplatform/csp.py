"""The Content-Security-Policy header, from settings.CONTENT_SECURITY_POLICY.

A dozen lines of our own rather than django-csp: the header is built once, at start, so a
response pays one header assignment (django-csp builds it anew for each response: ~150 us
measured here under load), and the pages use no nonce that would need more.

One exception: DRF's browsable API (the HTML a browser gets from /api/) puts style attributes
in its own templates; for those pages inline style is allowed. Scripts stay 'self' everywhere.
"""

from asgiref.sync import iscoroutinefunction, markcoroutinefunction
from django.conf import settings

HEADER = "Content-Security-Policy"
DEBUG_PAGES = (404, 500)


def policy_header(directives: dict[str, list[str]]) -> str:
    return "; ".join(f"{name} {' '.join(sources)}" for name, sources in directives.items())


class ContentSecurityPolicyMiddleware:
    # Both kinds: a sync-only middleware would make Django run the async event streams through
    # a thread (gpuplatform/asgi.py sends them to its ASGI handler to hold none).
    sync_capable = True
    async_capable = True

    def __init__(self, get_response):
        self.get_response = get_response
        if iscoroutinefunction(get_response):
            markcoroutinefunction(self)
        directives = settings.CONTENT_SECURITY_POLICY
        self.policy = policy_header(directives)
        self.browsable_api = policy_header(
            {**directives, "style-src": [*directives["style-src"], "'unsafe-inline'"]}
        )

    def __call__(self, request):
        if iscoroutinefunction(self):
            return self._acall(request)
        return self._with_header(request, self.get_response(request))

    async def _acall(self, request):
        return self._with_header(request, await self.get_response(request))

    def _with_header(self, request, response):
        if settings.DEBUG and response.status_code in DEBUG_PAGES:
            return response  # Django's technical 404/500 pages style themselves inline
        if HEADER not in response:
            html = response.get("Content-Type", "").startswith("text/html")
            response[HEADER] = (
                self.browsable_api if html and request.path.startswith("/api/") else self.policy
            )
        return response
