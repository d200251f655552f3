"""Sign-in hardening around Django's own login views: django-axes' throttle (who is the client,
what a locked-out sign-in answers) and the admin site that can demand a TOTP code from staff.

The settings are in gpuplatform/settings.py ("Sign-in throttling"); docs/operations.md tells
operators how to unlock an account and enrol a device.
"""

from __future__ import annotations

import math
from datetime import timedelta

from axes.backends import AxesStandaloneBackend
from django.conf import settings
from django.contrib.admin import AdminSite
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import render
from django_otp.admin import OTPAdminAuthenticationForm


class ThrottleBackend(AxesStandaloneBackend):
    """axes' lockout check, for sign-ins that come with a request (both login pages).

    A call without one (`Client.login`, a script) is not a sign-in from a client: axes would
    raise for it; here it simply goes on to the next backend."""

    def authenticate(self, request, username=None, password=None, **kwargs):
        if request is None:
            return None
        return super().authenticate(request, username=username, password=password, **kwargs)


def cool_off(request: HttpRequest | None = None) -> timedelta:
    return timedelta(seconds=settings.LOGIN_COOLOFF_SECONDS)


def client_ip(request: HttpRequest) -> str:
    """REMOTE_ADDR, unless it is one of GPUPLATFORM_TRUSTED_PROXIES: then the right-most
    X-Forwarded-For entry that is not a trusted proxy (entries to its left are the client's
    to forge)."""
    remote = request.META.get("REMOTE_ADDR", "")
    trusted = settings.TRUSTED_PROXIES
    if remote not in trusted:
        return remote
    forwarded = [
        a.strip() for a in request.META.get("HTTP_X_FORWARDED_FOR", "").split(",") if a.strip()
    ]
    for address in reversed(forwarded):
        if address not in trusted:
            return address
    return remote


def lockout_response(
    request: HttpRequest, original_response=None, credentials=None
) -> HttpResponse:
    """429 with Retry-After: the whole cool-off, since each attempt during it starts it again."""
    seconds = settings.LOGIN_COOLOFF_SECONDS
    message = (
        "Too many failed sign-ins for this username or from this address. "
        f"Try again in {_minutes(seconds)}."
    )
    if request.META.get("HTTP_X_REQUESTED_WITH") == "XMLHttpRequest" or request.path.startswith(
        "/api/"
    ):
        response: HttpResponse = JsonResponse({"detail": message}, status=429)
    else:
        response = render(request, "registration/locked_out.html", {"message": message}, status=429)
    response["Retry-After"] = str(seconds)
    return response


def _minutes(seconds: int) -> str:
    if seconds < 60:
        return f"{seconds} seconds"
    minutes = math.ceil(seconds / 60)
    return "1 minute" if minutes == 1 else f"{minutes} minutes"


class PlatformAdminSite(AdminSite):
    """Django's admin site; with STAFF_REQUIRE_2FA on, django-otp's rule: only a user verified by
    a TOTP device this session counts as staff, and the admin login asks for the code. Read at
    each request, so the setting can be flipped in tests."""

    @property
    def login_form(self):
        return OTPAdminAuthenticationForm if settings.STAFF_REQUIRE_2FA else None

    @property
    def login_template(self):
        return "otp/admin111/login.html" if settings.STAFF_REQUIRE_2FA else None

    def has_permission(self, request: HttpRequest) -> bool:
        if not super().has_permission(request):
            return False
        # django-otp's middleware gives every request's user is_verified()
        return not settings.STAFF_REQUIRE_2FA or request.user.is_verified()  # type: ignore[union-attr]
