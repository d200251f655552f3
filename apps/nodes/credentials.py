"""Node credentials: what a node agent authenticates to the agent API with.

A credential is `gpn_<key id>.<secret>`. Only the secret's SHA-256 is stored (the secret is 256
random bits, so a plain hash cannot be brute-forced the way a password's could); the key id finds
the row. Every request reads the row again, so a revoke or an expiry takes effect at once.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import secrets
from datetime import timedelta

from django.utils import timezone
from django.utils.crypto import salted_hmac

from apps.nodes.models import NodeCredential
from apps.platform.agent_protocol import CREDENTIAL_PREFIX

log = logging.getLogger(__name__)


def _digest(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


def issue_credential(
    *, node_name: str, expires_days: float | None = None
) -> tuple[NodeCredential, str]:
    """A new credential for `node_name`; the returned text is the only time the secret exists."""
    key_id, secret = secrets.token_hex(8), secrets.token_urlsafe(32)
    expires = timezone.now() + timedelta(days=expires_days) if expires_days else None
    row = NodeCredential.objects.create(node_name=node_name, key_id=key_id, secret_sha256=_digest(secret),
                                        expires_at=expires)  # fmt: skip
    return row, f"{CREDENTIAL_PREFIX}{key_id}.{secret}"


def message_key(*, node_name: str, agent_instance: str) -> bytes:
    """The key the platform signs a node's start messages with (apps/platform/agent_protocol.py,
    "signed start messages"), and that the agent gets in its register answer. Derived, never
    stored: from the platform's secret key, the node and the agent's instance, so a restarted or
    replacing agent gets a new one and the messages signed for the one before do not verify."""
    return salted_hmac("gpuplatform.nodes.start-message", f"{node_name}\n{agent_instance}",
                       algorithm="sha256").digest()  # fmt: skip


def revoke_credentials(*, node_name: str) -> int:
    """End every live credential of the node now; returns how many."""
    return NodeCredential.objects.filter(node_name=node_name, revoked_at=None).update(
        revoked_at=timezone.now()
    )


def revoke_node(*, node_name: str) -> int:
    """Cut a node off: every credential of it ends now (the agent API answers 401 from its next
    request) and its broker user is deleted (its open Redis connections close, so its agent
    cannot consume another message). Returns how many credentials ended. A Redis error comes
    up after the credentials are revoked (the caller says so)."""
    from apps.nodes import broker  # redis and the broker keys, only where a node is revoked

    count = revoke_credentials(node_name=node_name)
    try:
        broker.broker_username(node_name)
    except ValueError:
        return count  # a name no broker user can carry: it never had one to end
    broker.revoke_node_broker(node_name)
    return count


def credential_node(text: str) -> str | None:
    """The node a presented credential acts as, or None (unknown, wrong secret, revoked, expired)."""
    if not text.startswith(CREDENTIAL_PREFIX):
        return None
    key_id, sep, secret = text[len(CREDENTIAL_PREFIX) :].partition(".")
    if not sep or not key_id or not secret:
        return None
    # Every request of every agent reads it: plain values, no ORDER BY (key ids are unique).
    rows = NodeCredential.objects.filter(key_id=key_id).order_by()
    found = rows.values_list("node_name", "secret_sha256", "expires_at", "revoked_at")[:1]
    if not found:
        return None
    node_name, secret_sha256, expires_at, revoked_at = found[0]
    if not hmac.compare_digest(secret_sha256, _digest(secret)):
        return None
    if revoked_at is not None or (expires_at is not None and expires_at <= timezone.now()):
        return None
    return node_name
