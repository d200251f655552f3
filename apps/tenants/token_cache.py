"""This process's cache of authenticated API tokens (apps/tenants/auth.py), so that a request does
not read its token from the database every time, and the revocation channel that keeps it honest.

Every path that revokes, deletes or rotates a token, or deactivates, changes or deletes a user,
calls `revoked(...)`: it drops the entries here at once and, after the commit, publishes them on
Redis; a listener thread in each process that uses the cache drops them there (milliseconds;
the contract is 2 s, docs/operations.md "API tokens"). While that listener is not subscribed (Redis down, a
lost connection) an entry still lives at most TOKEN_CACHE_SECONDS (60 at most); on subscribing
again the whole cache is dropped, since messages may have gone by unheard.

Other per-process caches of credentials follow the same channel with messages of their own
(`follow`: apps/nodes/credentials.py keeps node credentials so): one listener thread a process,
one contract.

A fill races a revocation: a request reads a token just before the revocation commits and would
store it just after the message went by. `epoch` counts the messages heard: a fill is stored
only if none came while it read. Both caches are a `RevocableCache` (entries, the epoch, the
TTL), each with its own messages' kinds.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Generic, Protocol, TypeVar

import redis
from django.conf import settings
from django.contrib.auth import get_user_model
from django.db import DEFAULT_DB_ALIAS, transaction

from apps.platform.redis import shared_client
from apps.tenants.models import ApiToken

log = logging.getLogger(__name__)
CHANNEL = "gpuplatform:tokens:revoked"
RECONNECT_SECONDS = 1.0
# Tokens used within the cache's seconds in one process: far more than one web process serves.
MAX_ENTRIES = 10_000


@dataclass
class Entry:
    """A token and its user as their columns: each request gets instances of its own
    (`Model.from_db`), so what one request caches on them (a user's membership, read lazily)
    never reaches another."""

    token: dict
    user: dict
    stored_at: float  # time.monotonic()

    @classmethod
    def of(cls, token, user) -> Entry:
        return cls(columns(token), columns(user), time.monotonic())

    def instances(self) -> tuple:
        user_model = get_user_model()
        user = user_model.from_db(DEFAULT_DB_ALIAS, list(self.user), list(self.user.values()))
        token = ApiToken.from_db(DEFAULT_DB_ALIAS, list(self.token), list(self.token.values()))
        token.user = user
        return token, user


def columns(instance) -> dict:
    return {f.attname: getattr(instance, f.attname) for f in instance._meta.concrete_fields}


class Stored(Protocol):
    @property
    def stored_at(self) -> float: ...  # time.monotonic() when read from the database


V = TypeVar("V", bound=Stored)


class RevocableCache(Generic[V]):
    """Values by key, each kept TOKEN_CACHE_SECONDS at most, dropped at once by the revocation
    channel's messages: `<kind>:<key>` drops that key, `<owner kind>:<owner>` every value whose
    `owners[owner kind](value)` is that owner. `epoch` counts the drops heard: a fill is stored
    only if none came while it read (`put`). The token cache below is one; apps/nodes/credentials.py
    keeps node credentials in another and apps/admission/submitters.py submitters in a third,
    followers of the same listener."""

    def __init__(self, *, kind: str, owners: dict[str, Callable[[V], str]]) -> None:
        self.lock = threading.Lock()
        self.entries: dict[str, V] = {}
        self.epoch = 0
        self.kind = f"{kind}:"
        self.owners = {f"{owner_kind}:": owner for owner_kind, owner in owners.items()}

    def stored(self, key: str) -> V | None:
        """The value if stored less than TOKEN_CACHE_SECONDS ago (this process's listener
        started first: it is what keeps the value honest)."""
        ttl = settings.TOKEN_CACHE_SECONDS
        if not ttl:
            return None
        CACHE.listen()
        value = self.entries.get(key)
        if value is None or time.monotonic() - value.stored_at >= ttl:
            return None
        return value

    def put_value(self, key: str, value: V, *, epoch: int) -> None:
        """Store what was read from the database while `epoch` was current, unless a revocation
        was heard since."""
        if not settings.TOKEN_CACHE_SECONDS:
            return
        with self.lock:
            if epoch != self.epoch:
                return
            if len(self.entries) >= MAX_ENTRIES:
                self.sweep(value.stored_at)
            self.entries[key] = value

    def sweep(self, now: float) -> None:
        """Make room: the expired entries go, and all of them if that is not enough."""
        ttl = settings.TOKEN_CACHE_SECONDS
        for key, value in list(self.entries.items()):
            if now - value.stored_at >= ttl:
                del self.entries[key]
        if len(self.entries) >= MAX_ENTRIES:
            self.entries.clear()

    def drop(self, messages: list[str]) -> None:
        """The values these messages name go (messages of another cache's kinds: none)."""
        keys = {m.removeprefix(self.kind) for m in messages if m.startswith(self.kind)}
        named = {
            owner: names
            for kind, owner in self.owners.items()
            if (names := {m.removeprefix(kind) for m in messages if m.startswith(kind)})
        }
        if not keys and not named:
            return
        with self.lock:
            self.epoch += 1
            for key, value in list(self.entries.items()):
                if key in keys or any(owner(value) in names for owner, names in named.items()):
                    del self.entries[key]

    def forget(self) -> None:
        with self.lock:
            self.epoch += 1
            self.entries.clear()


class TokenCache(RevocableCache[Entry]):
    """Tokens by key digest: `token:<digest>` drops one, `user:<id>` every token of that user."""

    def __init__(self) -> None:
        super().__init__(kind="token", owners={"user": lambda e: str(e.token["user_id"])})
        self.listener: RevocationListener | None = None

    def get(self, digest: str) -> tuple | None:
        """(token, user), new instances, if stored less than TOKEN_CACHE_SECONDS ago."""
        entry = self.stored(digest)
        return None if entry is None else entry.instances()

    def put(self, digest: str, token, user, *, epoch: int) -> None:
        self.put_value(digest, Entry.of(token, user), epoch=epoch)

    def used(self, digest: str, token) -> None:
        """Keep the token's `last_used_at` as `tokens.touch` left it: one write a minute, not
        one for every request until the entry is read again."""
        entry = self.entries.get(digest)
        if entry is not None:
            entry.token["last_used_at"] = token.last_used_at

    def listen(self) -> None:
        """Start this process's listener (again after a fork: threads do not cross one, and
        what a parent kept was never heard here: every cache of the channel starts empty).
        A follower's cache calls it too, before each read of its own."""
        listener = self.listener
        if listener is not None and listener.pid == os.getpid():
            return
        with self.lock:
            if self.listener is None or self.listener.pid != os.getpid():
                self.entries.clear()
                for cache in FOLLOWERS:
                    cache.forget()
                self.listener = RevocationListener(self)
                self.listener.start()


class RevocationListener(threading.Thread):
    """Subscribed to CHANNEL; reconnects every RECONNECT_SECONDS while Redis does not answer."""

    def __init__(self, cache: TokenCache) -> None:
        super().__init__(name="token-revocations", daemon=True)
        self.cache = cache
        self.pid = os.getpid()
        self.subscribed = threading.Event()

    def run(self) -> None:
        while True:
            try:
                self.listen_once()
            except (redis.RedisError, OSError) as error:
                if not threading.main_thread().is_alive():
                    return  # the process is exiting (its Redis may be stopping first)
                if self.subscribed.is_set():
                    log.warning("token revocations: lost Redis (%s); cache entries live %ss at "
                                "most until it is back", error, settings.TOKEN_CACHE_SECONDS)  # fmt: skip
            except Exception:  # a bug must not end the thread: it would never hear again
                log.exception("token revocations: the listener failed; subscribing again")
            self.subscribed.clear()
            time.sleep(RECONNECT_SECONDS)

    def listen_once(self) -> None:
        conn = redis.Redis.from_url(
            settings.REDIS_URL, socket_connect_timeout=2, health_check_interval=10
        )
        with conn.pubsub() as pubsub:
            pubsub.subscribe(CHANNEL)
            while True:
                message = pubsub.get_message(timeout=1.0)
                if message is None:
                    continue
                if message["type"] == "subscribe":
                    for cache in (self.cache, *FOLLOWERS):
                        cache.forget()  # what was published while away went unheard
                    self.subscribed.set()
                elif message["type"] == "message":
                    messages = message["data"].decode().split()
                    for cache in (self.cache, *FOLLOWERS):
                        cache.drop(messages)


class Follower(Protocol):
    """A cache that drops entries on this channel's messages (those with a prefix of its own)
    and forgets everything when the listener subscribes again."""

    def drop(self, messages: list[str]) -> None: ...

    def forget(self) -> None: ...


CACHE = TokenCache()
FOLLOWERS: list[Follower] = []


def follow(cache: Follower) -> None:
    """Have this process's listener drive `cache` too (once; at import of its module)."""
    if cache not in FOLLOWERS:
        FOLLOWERS.append(cache)


def revoked(*, digests=(), user_ids=()) -> None:
    """Drop these tokens (by digest) and every token of these users (and what other caches keep
    of them: a submitter's membership), here now and in every web process once the transaction
    commits (before it, another process could read the old row back)."""
    dropped([f"token:{d}" for d in digests] + [f"user:{pk}" for pk in user_ids])


def tenants_changed(*, tenant_ids=(), tier_ids=()) -> None:
    """As `revoked`, for what a cache keeps of these tenants and of every tenant of these tiers
    (apps/admission/submitters.py: a submitter's tenant, tier and quota). Every path that
    changes or deletes a tenant, its quota, a tier or a membership calls it or `revoked`."""
    dropped([f"tenant:{pk}" for pk in tenant_ids] + [f"tier:{pk}" for pk in tier_ids])


def dropped(messages: list[str]) -> None:
    """These messages' entries go from this process's caches now, and from every web process's
    once the transaction commits (this process's listener hears them again then: a request
    that read the old row meanwhile stored nothing that stays)."""
    if not messages:
        return
    for cache in (CACHE, *FOLLOWERS):
        cache.drop(messages)
    transaction.on_commit(lambda: publish(messages))


def publish(messages: list[str]) -> None:
    try:
        shared_client().publish(CHANNEL, " ".join(messages))
    except redis.RedisError as error:
        log.warning("token revocations: could not publish (%s); other web processes drop these "
                    "tokens within %ss", error, settings.TOKEN_CACHE_SECONDS)  # fmt: skip
