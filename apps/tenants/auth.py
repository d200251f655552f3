"""API token authentication: DRF's `TokenAuthentication`, same tokens, header and errors, with
its lookup as one statement written once (apps/admission/rows.py) instead of an ORM query built
for every request (the query's compilation was ~0.35 ms of CPU, about half of a minimal
authenticated request's).

`SubmitterAuthentication` is the jobs API's for a submit: the same lookup also reads who is
submitting (membership, tenant, tier, quota) and the template and SKU the body names, all of
which the submit needs next, so a submit makes one statement where it made two.
"""

from __future__ import annotations

import json

from django.utils.translation import gettext_lazy as _
from rest_framework import authentication, exceptions

from apps.admission import rows

PEEK_LIMIT = 64 * 1024  # bytes of a body read for the names it gives (a larger one: read later)


class TokenAuthentication(authentication.TokenAuthentication):
    def authenticate_credentials(self, key):
        found = self.lookup(key)
        if found is None:
            raise exceptions.AuthenticationFailed(_("Invalid token."))
        token, user = found
        if not user.is_active:
            raise exceptions.AuthenticationFailed(_("User inactive or deleted."))
        return user, token

    def lookup(self, key: str) -> tuple | None:
        return rows.token_user(key)


class SubmitterAuthentication(TokenAuthentication):
    """For `POST /api/v1/jobs/`: `request.auth.submitter` is then the user's membership as
    `apps.admission.services.submitter` gives it (None: in no tenant)."""

    def authenticate(self, request):
        self.names = names_in(request)
        return super().authenticate(request)

    def lookup(self, key: str) -> tuple | None:
        found = rows.token_submitter(key, **self.names)
        if found is None:
            return None
        token, user, membership = found
        token.submitter = membership
        return token, user


def names_in(request) -> dict:
    """The template and SKU names a JSON body gives, read ahead of DRF's parsing (which happens
    after authentication); {} for anything else, and the view reads them itself."""
    django_request = request._request
    if django_request.content_type != "application/json":
        return {}
    try:
        if int(django_request.META.get("CONTENT_LENGTH") or 0) > PEEK_LIMIT:
            return {}
        body = json.loads(django_request.body)
    except Exception:  # not JSON, or not readable here: the view reads the body as usual
        return {}
    if not isinstance(body, dict):
        return {}
    named = (("template", "template"), ("sku", "gpu_sku"))
    return {kind: v for kind, field in named if isinstance(v := body.get(field), str)}
