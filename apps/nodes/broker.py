"""Broker credentials for node agents: each node's agent gets a Redis ACL user of its own,
limited to what a Celery consumer of its queue needs (apps/platform/broker_keys.py has the keys
and the agent-side settings; docs/reliability.md says exactly what the user can still do). The
agent never gets the platform's own Redis credential, except on a Redis without ACLs (< 6), where
there is nothing else to give and a warning says so.

The password is derived (HMAC of SECRET_KEY) from a random salt kept in Redis, so handing out the
URL again (every register) is idempotent, and a revoked node that is enrolled again gets a new one.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import re
import secrets
import urllib.parse
from typing import cast

import redis
from django.conf import settings

from apps.platform import broker_keys
from apps.platform.redis import client

log = logging.getLogger(__name__)

USER_PREFIX = "gpuplatform-node-"
SALT_KEY = "gpuplatform:broker:salt:{}"
# Names that are safe as an ACL user name and inside key patterns and the ACL file (which is
# split on spaces): anything else is refused rather than escaped.
_SAFE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:@-]{0,127}")

# What a kombu Redis consumer with late acks runs (found with a real worker and `ACL LOG`):
# BRPOP on its lists; MULTI/EXEC with ZADD+HSET to park a delivered message in its unacked keys,
# ZREM+HDEL to ack; the visibility restore under a lock (SET NX, then a Lua release via SCRIPT
# LOAD/EVALSHA, GET/DEL), ZREVRANGEBYSCORE+HGET, SMEMBERS of its binding and LPUSH/RPUSH back;
# LLEN/EXISTS for queue checks; PING for health checks; CLIENT SETNAME/SETINFO from redis-py;
# SELECT for a URL with a database other than 0 (key rules are the same in every database).
COMMANDS = (
    "ping", "select", "client|setname", "client|setinfo",
    "brpop", "lpush", "rpush", "llen", "exists",
    "smembers",
    "hset", "hget", "hdel", "zadd", "zrem", "zrevrangebyscore",
    "set", "get", "del",
    "multi", "exec", "discard", "watch", "unwatch",
    "evalsha", "script|load",
)  # fmt: skip


def broker_username(node_name: str) -> str:
    if not _SAFE_NAME.fullmatch(node_name):
        raise ValueError(
            f"node name {node_name!r} cannot name a broker user (letters, digits and ._:@- only)"
        )
    return USER_PREFIX + node_name


def acl_rules(node_name: str) -> list[str]:
    """The node user's ACL, without its password: nothing, then exactly its own keys and the
    commands above; no pub/sub channel at all."""
    keys = [f"~{_glob_escape(key)}" for key in broker_keys.node_keys(node_name)]
    return ["resetkeys", "resetchannels", "-@all", *keys, *(f"+{command}" for command in COMMANDS)]


def node_broker_url(node_name: str) -> str:
    """The broker URL a node's agent uses: its own ACL user limited to its queue (created or
    refreshed idempotently); where ACLs are unavailable, the platform's REDIS_URL."""
    username = broker_username(node_name)
    conn = client()
    password = _password(conn, node_name)
    try:
        _set_user(conn, username, password, acl_rules(node_name))
    except redis.ResponseError as error:
        if "unknown command" not in str(error).lower():
            raise
        log.warning(
            "Redis has no ACLs (it is older than 6): node %s gets the platform's own Redis credential; "
            "upgrade Redis so that agents get credentials limited to their queue",
            node_name,
        )
        return _agent_url(settings.REDIS_URL)
    # The platform binds the queue (the agent does not declare it; see broker_keys).
    conn.sadd(broker_keys.binding_key(node_name), broker_keys.binding_member(node_name))
    _save_acl(conn)
    return _agent_url(settings.REDIS_URL, username=username, password=password)


def revoke_node_broker(node_name: str) -> None:
    """Delete the node's broker user: its open connections are closed and the next is refused."""
    username = broker_username(node_name)
    conn = client()
    try:
        conn.execute_command("ACL", "DELUSER", username)
    except redis.ResponseError as error:
        if "unknown command" not in str(error).lower():
            raise
        return  # no ACLs: there was no user of its own to end
    conn.delete(SALT_KEY.format(node_name))
    _save_acl(conn)


def _password(conn: redis.Redis, node_name: str) -> str:
    key = SALT_KEY.format(node_name)
    conn.set(key, secrets.token_hex(16), nx=True)
    salt = cast(bytes | None, conn.get(key)) or b""  # a sync client: never an Awaitable
    message = b"gpuplatform-broker:" + node_name.encode() + b":" + salt
    secret = cast(str, settings.SECRET_KEY)  # settings.py refuses to start without one
    return hmac.new(secret.encode(), message, hashlib.sha256).hexdigest()


def _set_user(conn: redis.Redis, username: str, password: str, rules: list[str]) -> None:
    """`reset` first, so a refresh removes whatever an older rule set or a hand allowed; the
    password goes as its SHA-256 (`#`), so it never stands in Redis, its ACL file or a MONITOR."""
    digest = hashlib.sha256(password.encode()).hexdigest()
    args = ["reset", "on", f"#{digest}", *rules]
    try:
        conn.execute_command("ACL", "SETUSER", username, *args)
    except redis.ResponseError as error:
        # CLIENT SETINFO (sent by redis-py, errors ignored) is only known to Redis >= 7.2 ...
        # older ones refuse the rule; without it they log a harmless denial per connection.
        if "setinfo" not in str(error).lower():
            raise
        conn.execute_command(
            "ACL", "SETUSER", username, *[a for a in args if a != "+client|setinfo"]
        )


def _save_acl(conn: redis.Redis) -> None:
    """Keep the users across a Redis restart where it has an ACL file (the embedded one does)."""
    try:
        conn.execute_command("ACL", "SAVE")
    except redis.ResponseError:
        pass  # no aclfile configured: users live until Redis restarts; agents re-register


def _agent_url(platform_url: str, *, username: str = "", password: str = "") -> str:
    """GPUPLATFORM_AGENT_REDIS_URL (else the platform's URL) with the node's credentials in
    place of any there; scheme, host, port, database and query (TLS options) are kept."""
    base = urllib.parse.urlsplit(settings.AGENT_REDIS_URL or platform_url)
    if not username:  # the no-ACL fallback: the platform's own credentials
        own = urllib.parse.urlsplit(platform_url)
        username, password = own.username or "", own.password or ""
        username, password = urllib.parse.unquote(username), urllib.parse.unquote(password)
    host = base.hostname or "127.0.0.1"
    host = f"[{host}]" if ":" in host else host
    netloc = f"{host}:{base.port}" if base.port else host
    if username or password:
        netloc = f"{urllib.parse.quote(username, safe='')}:{urllib.parse.quote(password, safe='')}@{netloc}"
    return urllib.parse.urlunsplit(base._replace(netloc=netloc))


def _glob_escape(key: str) -> str:
    return re.sub(r"([\\*?\[\]])", r"\\\1", key)
