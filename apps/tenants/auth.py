"""API token authentication: DRF's `TokenAuthentication` header and errors (`Authorization: Token
<key>`), with the tokens of apps/tenants/tokens.py (hashed, named, expiring, revocable) found by
the key's digest in one statement written once (apps/admission/rows.py) instead of an ORM query
built for every request (the query's compilation was ~0.35 ms of CPU, about half of a minimal
authenticated request's).

`SubmitterAuthentication` is the jobs API's for a submit: the same lookup also reads who is
submitting (membership, tenant, tier, quota) and the template and SKU the body names, all of
which the submit needs next, so a submit makes one statement where it made two. The names come
from the view, which has DRF parse a small JSON body before authenticating
(apps/jobs/api.py `JobViewSet.perform_authentication`).
"""

from __future__ import annotations

import copy

from django.utils.translation import gettext_lazy as _
from rest_framework import authentication, exceptions

from apps.admission import rows, services, submitters
from apps.tenants import token_cache, tokens

PEEK_LIMIT = (
    64 * 1024
)  # the largest JSON body a submit parses before authentication, for the names it gives


class TokenAuthentication(authentication.TokenAuthentication):
    """A token found in this process's cache (apps/tenants/token_cache.py) costs no statement;
    its expiry is still checked on every request, and a revocation drops it from the cache."""

    def authenticate_credentials(self, key):
        digest = tokens.digest_of(key)
        found = token_cache.CACHE.get(digest)
        if found is None:
            epoch = token_cache.CACHE.epoch
            found = self.lookup(digest)
            if found is None:
                raise exceptions.AuthenticationFailed(_("Invalid token."))
            token_cache.CACHE.put(digest, *found, epoch=epoch)
        token, user = found
        refused = tokens.refusal(token)
        if refused:
            raise exceptions.AuthenticationFailed(refused)
        if not user.is_active:
            raise exceptions.AuthenticationFailed(_("User inactive or deleted."))
        if tokens.touch(token):
            token_cache.CACHE.used(digest, token)
        return user, token

    def lookup(self, digest: str) -> tuple | None:
        return rows.token_user(digest)


class SubmitterAuthentication(TokenAuthentication):
    """For `POST /api/v1/jobs/`: `request.auth.submitter` is then the user's membership as
    `apps.admission.services.submitter` gives it (None: in no tenant), read with the token, or
    alone where the token came from the cache (one statement at most; none where the body names
    no template or SKU and this process kept the membership: apps/admission/submitters.py, whose
    entries a change of the membership, tenant, tier or quota drops). `names`: the template and
    SKU the body names, set by the view before authentication ({}: none known)."""

    names: dict = {}  # noqa: RUF012 (never changed in place: the view sets an instance's own)

    def __init__(self) -> None:
        self.membership: tuple = ()  # (membership,) once the lookup read it

    def authenticate_credentials(self, key):
        user, token = super().authenticate_credentials(key)
        if not self.membership:  # the token came from the cache
            self.membership = (services.submitter(user, **self.names),)
        token = copy.copy(token)  # the cached row stays without it: a membership changes
        token.submitter = self.membership[0]
        return user, token

    def lookup(self, digest: str) -> tuple | None:
        epoch = submitters.CACHE.epoch
        found = rows.token_submitter(digest, **self.names)
        if found is None:
            return None
        token, user, membership = found
        self.membership = (membership,)
        submitters.CACHE.put(user, membership, epoch=epoch)
        return token, user
