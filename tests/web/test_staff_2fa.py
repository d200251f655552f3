"""GPUPLATFORM_STAFF_REQUIRE_2FA: with it on, staff without a verified TOTP device cannot use
the admin; with the code their enrolled device shows, they can. Off (the default), the admin is
as before."""

import io
from base64 import b32decode

import pytest
from django.core.management import call_command
from django.test import Client
from django_otp.oath import TOTP
from django_otp.plugins.otp_totp.models import TOTPDevice

from apps.tenants.services import user_create

PASSWORD = "right-password-123"


@pytest.fixture
def staff(db):
    user, _ = user_create(username="sam", tenant_slug=None, staff=True, password=PASSWORD)
    return user


@pytest.fixture
def require_2fa(settings):
    settings.STAFF_REQUIRE_2FA = True


def code_for(key: bytes, device: TOTPDevice) -> str:
    totp = TOTP(key, device.step, device.t0, device.digits, device.drift)
    return f"{totp.token():0{device.digits}d}"


def admin_login(client: Client, **fields):
    return client.post(
        "/admin/login/?next=/admin/", {"username": "sam", "password": PASSWORD, **fields}
    )


def test_off_by_default_a_password_opens_the_admin(staff):
    client = Client()
    assert admin_login(client).status_code == 302
    assert client.get("/admin/").status_code == 200


def test_staff_without_a_device_cannot_use_the_admin(staff, require_2fa):
    client = Client()
    response = admin_login(client)
    assert response.status_code == 200  # the form again: no code, no device
    assert client.get("/admin/").status_code == 302
    # Signed in through /login/ (password only), the admin still wants the second factor.
    signed_in = Client()
    signed_in.force_login(staff)
    assert signed_in.get("/admin/").status_code == 302
    assert signed_in.get("/admin/nodes/node/").status_code == 302


def test_a_wrong_code_is_refused(staff, require_2fa):
    device = TOTPDevice.objects.create(user=staff, name="phone", confirmed=True)
    client = Client()
    wrong = f"{(int(code_for(device.bin_key, device)) + 1) % 10**device.digits:06d}"
    response = admin_login(client, otp_device=device.persistent_id, otp_token=wrong)
    assert response.status_code == 200
    assert client.get("/admin/").status_code == 302


def test_an_enrolled_device_code_opens_the_admin(staff, require_2fa):
    out = io.StringIO()
    call_command("enrol_totp", "sam", stdout=out)
    lines = out.getvalue().splitlines()
    assert lines[-1].startswith("otpauth://totp/")
    secret = b32decode(lines[-2])
    device = TOTPDevice.objects.get(user=staff)

    client = Client()
    response = admin_login(
        client, otp_device=device.persistent_id, otp_token=code_for(secret, device)
    )
    assert response.status_code == 302
    assert client.get("/admin/").status_code == 200
    assert client.get("/admin/nodes/node/").status_code == 200
