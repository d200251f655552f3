"""Encryption at rest for tenant secrets: Fernet (AES-128-CBC and HMAC-SHA256, from
`cryptography`), several keys through MultiFernet.

Keys: `GPUPLATFORM_SECRET_KEYS` (settings.SECRET_ENCRYPTION_KEYS), comma-separated Fernet keys
(`python -c "from cryptography.fernet import Fernet; print(Fernet.generate_key().decode())"`).
The first encrypts; every one decrypts, so a key is rotated by putting a new one first, running
`manage.py rotate_secrets` (re-encrypts every row under it), then dropping the old one.

With none set, one key is derived from SECRET_KEY with HKDF-SHA256. That keeps a development
install working with no setting, but production should set its own keys: SECRET_KEY is also
what signs sessions and CSRF tokens, so it is read by more code and people than secrets should
be, rotating it (after a leak) would make every stored secret unreadable, and a database backup
together with the settings file would give up every value.

Each plaintext names its tenant and secret (`{"tenant": id, "name": ..., "value": ...}`) and a
decrypt checks them: a ciphertext copied into another tenant's row (by someone who can write the
database but not read the keys) does not decrypt there.
"""

from __future__ import annotations

import base64
import binascii
import json
from functools import lru_cache

from cryptography.fernet import Fernet, InvalidToken, MultiFernet
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.kdf.hkdf import HKDF
from django.conf import settings
from django.views.decorators.debug import sensitive_variables

HKDF_INFO = b"gpuplatform tenant secrets v1"


class SecretUnreadable(Exception):
    """No configured key decrypts the row, or it was made for another tenant or name."""


def valid_key(key: str) -> bool:
    """A Fernet key: 32 bytes in URL-safe base64 (44 characters)."""
    try:
        return len(base64.urlsafe_b64decode(key.encode("ascii"))) == 32
    except (binascii.Error, ValueError, UnicodeEncodeError):
        return False


def derived_key(secret_key: str) -> bytes:
    """The one Fernet key made from SECRET_KEY when no GPUPLATFORM_SECRET_KEYS are set."""
    hkdf = HKDF(algorithm=hashes.SHA256(), length=32, salt=None, info=HKDF_INFO)
    return base64.urlsafe_b64encode(hkdf.derive(secret_key.encode("utf-8")))


@lru_cache(maxsize=8)
def _fernet(keys: tuple[str, ...], secret_key: str) -> MultiFernet:
    if keys:
        return MultiFernet([Fernet(key.encode("ascii")) for key in keys])
    return MultiFernet([Fernet(derived_key(secret_key))])


def fernet() -> MultiFernet:
    """The keys as the settings give them now (tests override the settings)."""
    keys = tuple(getattr(settings, "SECRET_ENCRYPTION_KEYS", ()) or ())
    return _fernet(keys, settings.SECRET_KEY)


@sensitive_variables()  # a 500's report (DEBUG page, error mail) shows no local
def encrypt(*, tenant_id: int, name: str, value: str) -> str:
    plain = json.dumps({"tenant": tenant_id, "name": name, "value": value}).encode("utf-8")
    return fernet().encrypt(plain).decode("ascii")


@sensitive_variables()
def decrypt(*, tenant_id: int, name: str, ciphertext: str) -> str:
    try:
        plain = json.loads(fernet().decrypt(ciphertext.encode("ascii")))
    except (InvalidToken, ValueError, UnicodeEncodeError):
        raise SecretUnreadable(
            f"secret {name} cannot be decrypted with the configured keys"
        ) from None
    if not isinstance(plain, dict) or plain.get("tenant") != tenant_id or plain.get("name") != name:
        raise SecretUnreadable(f"secret {name}'s ciphertext was not made for it")
    value = plain.get("value")
    if not isinstance(value, str):
        raise SecretUnreadable(f"secret {name}'s ciphertext holds no value")
    return value


@sensitive_variables()
def rotate(ciphertext: str) -> str:
    """The same plaintext encrypted under the first key (MultiFernet.rotate)."""
    try:
        return fernet().rotate(ciphertext.encode("ascii")).decode("ascii")
    except (InvalidToken, UnicodeEncodeError):
        raise SecretUnreadable("cannot be decrypted with the configured keys") from None
