"""Secrets at rest (apps/secrets/crypto.py): Fernet under the first of GPUPLATFORM_SECRET_KEYS,
every key decrypts, `rotate_secrets` re-encrypts under the first; with no keys set, one derived
from SECRET_KEY; a ciphertext only decrypts for the tenant and name it was made for."""

import io
import os
import subprocess
import sys

import pytest
from cryptography.fernet import Fernet, InvalidToken
from django.core.management import CommandError, call_command

from apps.secrets import crypto
from apps.secrets.models import Secret
from apps.secrets.services import secret_create, secret_values
from apps.tenants.models import Tenant
from tests.factories import make_cast

OLD, NEW = Fernet.generate_key().decode(), Fernet.generate_key().decode()
VALUE = "rotate-me-7c1e-VALUE"  # noqa: S105 (a test's value)


@pytest.fixture
def acme(db):
    cast = make_cast()
    return Tenant.objects.get(slug="acme"), cast["alice"][0]


def values(tenant, *names):
    return secret_values(tenant_id=tenant.pk, names=list(names))[0]


def rotate() -> str:
    out = io.StringIO()
    call_command("rotate_secrets", stdout=out)
    return out.getvalue()


def test_a_secret_written_under_an_old_key_decrypts_before_rotate_and_after_without_it(
    acme, settings
):
    tenant, alice = acme
    settings.SECRET_ENCRYPTION_KEYS = [OLD]
    secret_create(tenant=tenant, name="HF_TOKEN", value=VALUE, user=alice)
    written = Secret.objects.get().ciphertext
    Fernet(OLD.encode()).decrypt(written.encode())  # made under OLD

    settings.SECRET_ENCRYPTION_KEYS = [NEW, OLD]  # a new first key: the old one still decrypts
    assert values(tenant, "HF_TOKEN") == {"HF_TOKEN": VALUE}
    secret_create(tenant=tenant, name="WANDB_KEY", value="w", user=alice)  # new rows: NEW
    Fernet(NEW.encode()).decrypt(Secret.objects.get(name="WANDB_KEY").ciphertext.encode())

    output = rotate()
    assert output.strip() == "rotated 2 secret(s) under the first of 2 key(s)"  # counts only
    rotated = Secret.objects.get(name="HF_TOKEN").ciphertext
    assert rotated != written
    with pytest.raises(InvalidToken):
        Fernet(OLD.encode()).decrypt(rotated.encode())

    settings.SECRET_ENCRYPTION_KEYS = [NEW]  # the old key removed
    assert values(tenant, "HF_TOKEN", "WANDB_KEY") == {"HF_TOKEN": VALUE, "WANDB_KEY": "w"}


def test_without_rotating_removing_the_old_key_makes_it_unreadable_and_rotate_says_so(
    acme, settings
):
    tenant, alice = acme
    settings.SECRET_ENCRYPTION_KEYS = [OLD]
    secret_create(tenant=tenant, name="HF_TOKEN", value=VALUE, user=alice)
    settings.SECRET_ENCRYPTION_KEYS = [NEW]
    with pytest.raises(crypto.SecretUnreadable):
        values(tenant, "HF_TOKEN")
    out = io.StringIO()
    with pytest.raises(CommandError, match="1 secret"):
        call_command("rotate_secrets", stdout=out)
    assert "rotated 0 secret(s)" in out.getvalue()
    settings.SECRET_ENCRYPTION_KEYS = [NEW, OLD]
    assert values(tenant, "HF_TOKEN") == {"HF_TOKEN": VALUE}  # left as it was


def test_rotate_keeps_updated_at(acme, settings):
    tenant, alice = acme
    settings.SECRET_ENCRYPTION_KEYS = [OLD]
    secret = secret_create(tenant=tenant, name="HF_TOKEN", value=VALUE, user=alice)
    settings.SECRET_ENCRYPTION_KEYS = [NEW, OLD]
    rotate()
    assert Secret.objects.get().updated_at == secret.updated_at  # the value did not change


def test_with_no_keys_set_a_key_derived_from_secret_key_is_used(acme, settings):
    tenant, alice = acme
    settings.SECRET_ENCRYPTION_KEYS = []
    secret_create(tenant=tenant, name="HF_TOKEN", value=VALUE, user=alice)
    ciphertext = Secret.objects.get().ciphertext
    Fernet(crypto.derived_key(settings.SECRET_KEY)).decrypt(ciphertext.encode())
    assert crypto.derived_key("another") != crypto.derived_key(settings.SECRET_KEY)
    settings.SECRET_KEY = "another-secret-key-entirely"
    with pytest.raises(crypto.SecretUnreadable):
        values(tenant, "HF_TOKEN")


def test_a_ciphertext_copied_to_another_tenant_or_name_does_not_decrypt(acme):
    tenant, alice = acme
    secret_create(tenant=tenant, name="HF_TOKEN", value=VALUE, user=alice)
    globex = Tenant.objects.get(slug="globex")
    stolen = Secret.objects.get().ciphertext
    Secret.objects.create(tenant=globex, name="HF_TOKEN", ciphertext=stolen)
    Secret.objects.create(tenant=tenant, name="OTHER", ciphertext=stolen)
    with pytest.raises(crypto.SecretUnreadable):
        values(globex, "HF_TOKEN")
    with pytest.raises(crypto.SecretUnreadable):
        values(tenant, "OTHER")
    assert values(tenant, "HF_TOKEN") == {"HF_TOKEN": VALUE}


def test_keys_are_checked_at_start():
    assert crypto.valid_key(OLD) and not crypto.valid_key("short") and not crypto.valid_key("é")
    env = {**os.environ, "SECRET_KEY": "x", "GPUPLATFORM_SECRET_KEYS": f"{OLD},not-a-key"}
    result = subprocess.run(
        [sys.executable, "manage.py", "check"], env=env, capture_output=True, text=True
    )
    assert result.returncode != 0
    assert "ImproperlyConfigured" in result.stderr and "GPUPLATFORM_SECRET_KEYS" in result.stderr
    assert "not-a-key" not in result.stderr  # a key, even a bad one, is not printed
    good = subprocess.run([sys.executable, "manage.py", "check"], env={**env, "GPUPLATFORM_SECRET_KEYS": f"{NEW}, {OLD}"},
                          capture_output=True, text=True)  # fmt: skip
    assert good.returncode == 0, good.stderr
