"""The middleware that serves people's browsers only (their session, its sign-in and second
factor, flash messages, htmx), made to step aside for the agent API
(`/internal/agent/`): a node agent authenticates every request with its credential and needs
none of it, and the drain of a queue is mostly agents' requests.

Each class here is the package's own, subclassed, so the admin's checks (which want a session,
authentication and messages middleware) still find theirs. What guards every response (security
headers, CSRF, clickjacking, CSP) stays in settings.MIDDLEWARE as it was, for agents too, and so
does axes' (its check wants its own class by name; it only looks at the response), and so does
Django's SessionMiddleware: `check --deploy`'s session-cookie warnings (security.W010-W012) look
for it by name, and a subclass hid them. Its cost for an agent is a lazy session never read.
"""

from __future__ import annotations

from django.contrib.auth.middleware import AuthenticationMiddleware
from django.contrib.messages.middleware import MessageMiddleware
from django_htmx.middleware import HtmxMiddleware
from django_otp.middleware import OTPMiddleware

AGENT_API = "/internal/agent/"
API = "/api/"


class NotForAgents:
    """Pass an agent API request straight on; run the middleware for anything else."""

    def __call__(self, request):
        if request.path_info.startswith(AGENT_API):
            return self.get_response(request)
        return super().__call__(request)


class Authentication(NotForAgents, AuthenticationMiddleware):
    pass


class Otp(NotForAgents, OTPMiddleware):
    pass


class Messages(MessageMiddleware):
    """Flash messages, for pages: the API (`/api/`) neither adds nor shows any, so its requests
    skip the message store's set-up too (a fallback store over the cookie and the session,
    ~30 us a request; docs/bench/71-slurm-peer-notes.md, h39submit pass), as agents' do."""

    def __call__(self, request):
        if request.path_info.startswith((AGENT_API, API)):
            return self.get_response(request)
        return super().__call__(request)


class Htmx(NotForAgents, HtmxMiddleware):
    pass
