"""Sign-in throttling (django-axes) on both login pages: per username and per client address,
the sixth wrong password within the cool-off is refused with 429 and Retry-After, and so is the
right one until the cool-off has passed; then the right password works. API tokens are never
locked out. The cool-off is made to pass by moving the recorded failures back in time."""

from datetime import timedelta

import pytest
from axes.models import AccessAttempt
from django.conf import settings
from django.db.models import F
from django.test import Client

from apps.tenants.services import user_create
from tests.factories import client_for

PASSWORD = "right-password-123"
PAGES = ["/login/", "/admin/login/"]


@pytest.fixture
def staff(db):
    user, token = user_create(username="sam", tenant_slug=None, staff=True, password=PASSWORD)
    return user, token


def sign_in(page: str, username: str, password: str, address: str = "203.0.113.7", **headers):
    return Client(REMOTE_ADDR=address, **headers).post(
        page, {"username": username, "password": password}
    )


def signed_in(response) -> bool:
    return response.status_code == 302 and "login" not in response["Location"]


def let_the_cool_off_pass() -> None:
    AccessAttempt.objects.update(
        attempt_time=F("attempt_time") - timedelta(seconds=settings.LOGIN_COOLOFF_SECONDS + 1)
    )


@pytest.mark.parametrize("page", PAGES)
def test_the_sixth_wrong_password_is_throttled_and_the_right_one_works_after_the_cool_off(
    staff, page
):
    for _ in range(5):
        response = sign_in(page, "sam", "wrong")
        assert response.status_code == 200  # the form again, with its error
    sixth = sign_in(page, "sam", "wrong")
    assert sixth.status_code == 429
    assert sixth["Retry-After"] == str(settings.LOGIN_COOLOFF_SECONDS)
    assert b"Too many failed sign-ins" in sixth.content

    during = sign_in(page, "sam", PASSWORD)
    assert during.status_code == 429 and not signed_in(during)

    let_the_cool_off_pass()
    assert signed_in(sign_in(page, "sam", PASSWORD))


def test_failures_count_across_both_pages(staff):
    for page in PAGES * 2 + ["/login/"]:
        assert sign_in(page, "sam", "wrong").status_code == 200
    assert sign_in("/admin/login/", "sam", "wrong").status_code == 429


def test_per_username_from_many_addresses(staff):
    for n in range(5):
        assert sign_in("/login/", "sam", "wrong", address=f"198.51.100.{n}").status_code == 200
    assert sign_in("/login/", "sam", "wrong", address="198.51.100.99").status_code == 429
    # Another user from a fresh address is not touched.
    user_create(username="other", tenant_slug=None, staff=True, password=PASSWORD)
    assert signed_in(sign_in("/login/", "other", PASSWORD, address="192.0.2.1"))


def test_per_address_across_many_usernames(staff):
    for n in range(5):
        assert sign_in("/login/", f"guess{n}", "wrong").status_code == 200
    assert sign_in("/login/", "guess-last", "wrong").status_code == 429
    # The same address, even with the right password for a real account, waits too.
    assert sign_in("/login/", "sam", PASSWORD).status_code == 429
    # From elsewhere that account signs in.
    assert signed_in(sign_in("/login/", "sam", PASSWORD, address="192.0.2.50"))


def test_a_forged_forwarded_for_does_not_dodge_the_address_count(staff):
    for n in range(6):
        response = sign_in("/login/", f"guess{n}", "wrong", HTTP_X_FORWARDED_FOR=f"10.9.9.{n}")
    assert response.status_code == 429


def test_behind_a_trusted_proxy_the_client_is_the_forwarded_address(staff, settings):
    settings.TRUSTED_PROXIES = ["10.0.0.2"]
    for _ in range(6):
        last = sign_in(
            "/login/",
            "nobody",
            "wrong",
            address="10.0.0.2",
            HTTP_X_FORWARDED_FOR="1.2.3.4, 203.0.113.9",
        )
    assert last.status_code == 429
    # Another client through the same proxy is a different address (the username "sam" is fresh).
    ok = sign_in(
        "/login/", "sam", PASSWORD, address="10.0.0.2", HTTP_X_FORWARDED_FOR="203.0.113.10"
    )
    assert signed_in(ok)


def test_api_tokens_are_not_locked_out_by_username(staff):
    user, token = staff
    for _ in range(8):
        sign_in("/login/", "sam", "wrong")
    assert sign_in("/login/", "sam", PASSWORD).status_code == 429
    assert client_for(token).get("/api/v1/nodes/").status_code == 200
