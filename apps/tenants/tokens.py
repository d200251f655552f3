"""API tokens: made, checked and revoked here; stored as the SHA-256 of the key (models.ApiToken).

A key is `gpp_` and 32 random bytes (urlsafe base64): the prefix lets secret scanners match a
leaked key, the randomness makes a plain hash enough. The key is returned once, by `token_issue`,
and never stored. Names are per user: issuing a token under a name the user already holds
replaces (revokes) the old one, so `create_user --token` and `bootstrap_demo` rotate their own
token instead of piling up new ones.
"""

from __future__ import annotations

import hashlib
import secrets
from datetime import timedelta

from django.conf import settings
from django.db import transaction
from django.db.models import Q
from django.utils import timezone

from apps.tenants import token_cache
from apps.tenants.models import ApiToken

PREFIX = "gpp_"
SHOWN = 12  # characters of the key kept to recognise it by (the prefix and 8 of the secret)
TOUCH_EVERY = timedelta(
    minutes=1
)  # last_used_at is kept to the minute: one UPDATE a minute at most


class TokenError(Exception):
    pass


def digest_of(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


def expiry(days: int | None):
    """When a token made now for `days` expires (None: the setting's default; 0: never)."""
    days = settings.TOKEN_EXPIRY_DAYS if days is None else days
    return timezone.now() + timedelta(days=days) if days else None


@transaction.atomic
def token_issue(*, user, name: str, days: int | None = None) -> tuple[ApiToken, str]:
    """A new token for `user` under `name` (the old one of that name, if any, revoked); returns
    the row and the key, which is shown once and kept nowhere."""
    name = name.strip()
    longest = ApiToken._meta.get_field("name").max_length
    if not name or (longest is not None and len(name) > longest):
        raise TokenError("a token's name is 1 to 64 characters")
    if days is not None and days < 0:
        raise TokenError("days must be 0 (never expires) or more")
    _revoke(ApiToken.objects.filter(user=user, name=name, revoked_at__isnull=True))
    key = PREFIX + secrets.token_urlsafe(32)
    token = ApiToken.objects.create(
        user=user, name=name, prefix=key[:SHOWN], digest=digest_of(key), expires_at=expiry(days)
    )
    return token, key


def token_revoke(
    *, user, name: str | None = None, token_id: int | None = None, everything: bool = False
) -> int:
    """Revoke the user's active token by name or id, or all of them; returns how many."""
    active = ApiToken.objects.filter(user=user, revoked_at__isnull=True)
    if not everything:
        if name is None and token_id is None:
            raise TokenError("say which token: a name, an id, or all")
        if name is not None:
            active = active.filter(name=name)
        else:
            active = active.filter(pk=token_id or 0)  # token_id is set: checked above
    return _revoke(active)


@transaction.atomic
def _revoke(active) -> int:
    """Revoke these tokens, and drop them from every web process's cache (token_cache.py)."""
    digests = list(active.select_for_update().values_list("digest", flat=True))
    token_cache.revoked(digests=digests)
    return active.filter(digest__in=digests).update(revoked_at=timezone.now())


def refusal(token: ApiToken) -> str | None:
    """Why this token may not be used now (None: it may)."""
    if token.revoked_at is not None:
        return "Token revoked."
    if token.expires_at is not None and token.expires_at <= timezone.now():
        return "Token expired."
    return None


def touch(token: ApiToken) -> bool:
    """Record a use, at most once a minute per token (a guarded UPDATE: several web processes
    seeing the same stale time write once between them). A token's first minute counts as used
    at its creation: its first requests (a script's first submit) then cost no write, which keeps
    a submit inside its statement budget (tests/admission/test_submit_queries.py); the price is
    that a token used only in the minute it was made still shows as never used."""
    now = timezone.now()
    if now - (token.last_used_at or token.created_at) < TOUCH_EVERY:
        return False
    stale = Q(last_used_at__isnull=True) | Q(last_used_at__lt=now - TOUCH_EVERY)
    ApiToken.objects.filter(stale, pk=token.pk).update(last_used_at=now)
    token.last_used_at = now
    return True


def active_tokens(user):
    return ApiToken.objects.filter(user=user, revoked_at__isnull=True).order_by("name")
