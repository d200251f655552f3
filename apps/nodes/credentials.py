"""Node credentials: what a node agent authenticates to the agent API with.

A credential is `gpn_<key id>.<secret>`. Only the secret's SHA-256 is stored (the secret is 256
random bits, so a plain hash cannot be brute-forced the way a password's could); the key id finds
the row. Each web process keeps the rows it read (`CredentialCache`), as it keeps API tokens:
a revoke drops them in every process through the token cache's Redis channel (within 2 s;
apps/tenants/token_cache.py), and an entry lives at most TOKEN_CACHE_SECONDS should that channel
be down. An expiry is checked on every request against the kept row.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import secrets
import time
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.db import transaction
from django.utils import timezone
from django.utils.crypto import salted_hmac

from apps.nodes.models import NodeCredential
from apps.platform.agent_protocol import CREDENTIAL_PREFIX
from apps.tenants import token_cache

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
    count = NodeCredential.objects.filter(node_name=node_name, revoked_at=None).update(
        revoked_at=timezone.now()
    )
    credentials_changed(node_names=[node_name])
    return count


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
    row = CACHE.get(key_id) or _read(key_id)
    if row is None or not hmac.compare_digest(row.secret_sha256, _digest(secret)):
        return None
    if row.expires_at is not None and row.expires_at <= timezone.now():
        return None
    return row.node_name


def _read(key_id: str) -> Credential | None:
    """The live row of `key_id` from the database, kept in this process's cache."""
    epoch = CACHE.epoch
    # Plain values, no ORDER BY (key ids are unique).
    rows = NodeCredential.objects.filter(key_id=key_id, revoked_at=None).order_by()
    found = rows.values_list("node_name", "secret_sha256", "expires_at")[:1]
    if not found:
        return None
    row = Credential(*found[0], stored_at=time.monotonic())
    CACHE.put(key_id, row, epoch=epoch)
    return row


# --- this process's cache of credentials ---------------------------------------------------------


@dataclass(frozen=True)
class Credential:
    """A live credential's row as the agent API checks it."""

    node_name: str
    secret_sha256: str
    expires_at: datetime | None
    stored_at: float  # time.monotonic()


class CredentialCache(token_cache.RevocableCache[Credential]):
    """Live credentials by key id, each kept TOKEN_CACHE_SECONDS at most; a follower of the token
    cache's revocation channel: `credential:<key id>` drops one, `node:<name>` every credential
    of that node."""

    def __init__(self) -> None:
        super().__init__(kind="credential", owners={"node": lambda row: row.node_name})

    def get(self, key_id: str) -> Credential | None:
        return self.stored(key_id)

    def put(self, key_id: str, row: Credential, *, epoch: int) -> None:
        self.put_value(key_id, row, epoch=epoch)


CACHE = CredentialCache()
token_cache.follow(CACHE)


def credentials_changed(*, key_ids=(), node_names=()) -> None:
    """Drop these credentials (by key id) and every credential of these nodes, here now and in
    every web process once the transaction commits: every path that revokes, changes or deletes
    a credential calls it."""
    messages = [f"credential:{k}" for k in key_ids] + [f"node:{n}" for n in node_names]
    if not messages:
        return
    CACHE.drop(messages)
    transaction.on_commit(lambda: token_cache.publish(messages))
