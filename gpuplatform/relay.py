"""The session relay (docs/interactive.md): two websocket legs, the client's
(`/api/v1/sessions/{id}/`, with the ticket its `POST .../sessions/` gave) and the node agent's
(`/internal/agent/v1/sessions/{id}/`, with its node credential; the agent dials out, so a node
needs no inbound port), joined through Redis so that each leg may land on any web process.

Each direction is a Redis list of at most HIGH_WATER frames (of at most MAX_FRAME bytes): a leg
pushes what its socket sends and pops what its socket must receive. A leg whose list is full
stops reading its socket until the other side drained it below LOW_WATER, so the sender's own
socket fills and it waits: a slow reader grows no memory anywhere (the web's, Redis's) and stalls
no other session. The legs are coroutines on the server's event loop: an open session holds no
thread. The relay reads no frame: bytes in, bytes out, and never a byte in a log.

Why not Django Channels: channels-redis's group and channel layer drops or refuses messages past
its capacity instead of holding the sender back, and it brings a second server stack (consumers,
routing) beside the one gpuplatform/asgi.py already is; a plain ASGI websocket route over
uvicorn's websocket support, two Redis lists and two pumps per leg is all a session needs.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import re
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any
from urllib.parse import parse_qs

import redis.asyncio as aioredis
from django.conf import settings
from django.db import close_old_connections

from apps.platform import session_activity
from apps.scheduling import sessions

log = logging.getLogger(__name__)

CLIENT_PATH = re.compile(r"^/api/v1/sessions/([0-9a-f]{32})/$")
AGENT_PATH = re.compile(r"^/internal/agent/v1/sessions/([0-9a-f]{32})/$")
MAX_FRAME = 256 * 1024 + 64  # the client and the agent send at most 256 KiB of data a frame
HIGH_WATER = 16  # frames queued one way: at most ~4 MiB a direction in Redis
LOW_WATER = 4
POP_MANY = 8  # frames taken from Redis in one round trip when more are waiting
ATTACH_SECONDS = float(os.environ.get("GPUPLATFORM_SESSION_ATTACH_SECONDS") or 20)
ALIVE_SECONDS = 5  # a leg's heartbeat key lives this long; the other leg ends without it
BEAT_SECONDS = 1.0
RENEW_EVERY = 10  # beats
DATA, END = b"d", b"e"
# Close codes the client reads (client/gpuplatform_client/interactive.py).
ENDED, REVOKED, PEER_GONE, NEVER_ANSWERED = 4000, 4001, 4002, 4003

_pool = ThreadPoolExecutor(max_workers=2, thread_name_prefix="relay")
_redis: dict[int, aioredis.Redis] = {}
_open: dict[str, Leg] = {}  # this process's client legs, by session (revocation, renewal)
_watcher: asyncio.Task | None = None


def redis_client() -> Any:
    """This loop's asyncio client (typed Any: redis-py types each command as sync-or-awaitable)."""
    loop = id(asyncio.get_running_loop())
    if loop not in _redis:
        _redis[loop] = aioredis.Redis.from_url(settings.REDIS_URL, socket_connect_timeout=2)
    return _redis[loop]


async def in_pool(function, *args):
    """A database or blocking call, off the loop (a session start, its end, a token check)."""

    def call():
        close_old_connections()
        return function(*args)

    return await asyncio.get_running_loop().run_in_executor(_pool, call)


def lists(session: str) -> tuple[str, str]:
    """(client -> agent, agent -> client)."""
    return f"{sessions.key(session)}:up", f"{sessions.key(session)}:down"


def alive_key(session: str, side: str) -> str:
    return f"{sessions.key(session)}:alive:{side}"


class Leg:
    """One websocket of a session and its two pumps."""

    def __init__(self, session: str, side: str, receive, send, *, token_id: str = "",
                 attempt_id: int | None = None):  # fmt: skip
        self.session, self.side, self.receive, self.send = session, side, receive, send
        self.token_id = token_id
        self.attempt_id = attempt_id  # the agent's leg marks its attempt's activity
        self.marked = 0.0
        up, down = lists(session)
        self.inbox, self.outbox = (down, up) if side == "client" else (up, down)
        self.peer = "agent" if side == "client" else "client"
        self.ended: asyncio.Future = asyncio.get_running_loop().create_future()
        self.peer_seen = False
        self.told_peer = False  # the other leg has this leg's end in its list
        self.slots: list[str] = []

    def end(self, code: int, why: str) -> None:
        if not self.ended.done():
            self.ended.set_result((code, why))

    async def run(self) -> tuple[int, str]:
        tasks = [asyncio.create_task(t) for t in (self.pump_in(), self.pump_out(), self.beat())]
        for task in tasks:
            task.add_done_callback(self.pump_done)
        try:
            code, why = await self.ended
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
        if not self.told_peer:  # revoked, the peer lost, a bad frame: the other leg ends too
            try:
                await redis_client().rpush(self.outbox, END + why.encode())
                await redis_client().expire(self.outbox, sessions.PENDING_SECONDS)
            except Exception:
                log.warning(
                    "could not tell the other leg of session %s that it ended", self.session
                )
        return code, why

    def pump_done(self, task: asyncio.Task) -> None:
        """A pump that failed (Redis gone, a socket error) ends the session rather than leave it
        half open."""
        if not task.cancelled() and task.exception() is not None:
            log.warning("session %s: its relay failed (%s)", self.session[:8], task.exception())
            self.end(1011, "the relay failed")

    async def push(self, item: bytes) -> None:
        """Queue a frame for the other leg; wait while its list is full (backpressure)."""
        conn = redis_client()
        queued = await conn.rpush(self.outbox, item)
        if queued == 1:  # a list is gone once empty: a new one gets its lifetime (a leftover's)
            await conn.expire(self.outbox, sessions.PENDING_SECONDS)
        while queued > HIGH_WATER:
            await asyncio.sleep(0.005)
            queued = await conn.llen(self.outbox)
            if queued <= LOW_WATER:
                break

    async def mark_active(self) -> None:
        """A byte passed, typed or printed: the attempt's activity, which every rank's idle
        timeout reads (apps/platform/session_activity.py), at most once a MARK_EVERY."""
        now = time.time()
        if self.attempt_id is None or now - self.marked < session_activity.MARK_EVERY:
            return
        self.marked = now
        await redis_client().set(
            session_activity.key(self.attempt_id), repr(now), ex=session_activity.KEEP_SECONDS
        )

    async def pump_in(self) -> None:
        """This leg's socket -> the other leg's list."""
        while True:
            message = await self.receive()
            if message["type"] == "websocket.disconnect":
                why = f"the {self.side} left"
                self.end(ENDED, why)
                return
            data = message.get("bytes")
            if data is None:  # a text frame: the protocol is binary
                data = (message.get("text") or "").encode()
            if len(data) > MAX_FRAME:
                self.end(1009, "frame too large")
                return
            await self.mark_active()
            await self.push(DATA + data)

    async def pump_out(self) -> None:
        """The other leg's list -> this leg's socket."""
        conn = redis_client()
        attach_by = time.monotonic() + ATTACH_SECONDS
        while True:
            popped = await conn.blpop([self.inbox], timeout=1)
            if popped is None:
                await self.check_peer(attach_by)
                continue
            items = [popped[1], *(await conn.lpop(self.inbox, POP_MANY) or [])]
            for item in items:
                if item[:1] == END:
                    self.told_peer = True  # it ended first: nothing to tell it
                    self.end(ENDED, item[1:].decode(errors="replace"))
                    return
                self.peer_seen = True
                await self.mark_active()
                await self.send({"type": "websocket.send", "bytes": item[1:]})

    async def check_peer(self, attach_by: float) -> None:
        there = await redis_client().exists(alive_key(self.session, self.peer))
        if there:
            self.peer_seen = True
        elif self.peer_seen:
            self.end(PEER_GONE, f"the {self.peer}'s connection to the web was lost")
        elif time.monotonic() > attach_by:
            self.end(NEVER_ANSWERED, f"the {self.peer} did not attach")

    async def beat(self) -> None:
        conn = redis_client()
        while True:
            await conn.set(alive_key(self.session, self.side), b"1", ex=ALIVE_SECONDS)
            await asyncio.sleep(BEAT_SECONDS)


async def serve(scope, receive, send) -> None:
    """The websocket route of gpuplatform/asgi.py."""
    path = scope["path"]
    if match := CLIENT_PATH.match(path):
        await client_leg(match.group(1), scope, receive, send)
    elif match := AGENT_PATH.match(path):
        await agent_leg(match.group(1), scope, receive, send)
    else:
        await receive()  # websocket.connect
        await send({"type": "websocket.close", "code": 4404})


def query_ticket(scope) -> str:
    values = parse_qs(scope.get("query_string", b"").decode("latin1")).get("ticket") or [""]
    return values[0]


def header(scope, name: bytes) -> str:
    for key, value in scope.get("headers", []):
        if key.lower() == name:
            return value.decode("latin1")
    return ""


async def client_leg(session: str, scope, receive, send) -> None:
    await receive()  # websocket.connect
    # The ticket comes as a header, or (a browser's WebSocket sets none) in the query string;
    # it is spent here, so a copy in an access log opens nothing.
    ticket = header(scope, b"x-session-ticket") or query_ticket(scope)
    record = await in_pool(sessions.check_ticket, session, ticket)
    if record is None:
        await send({"type": "websocket.close", "code": 4403})  # refused before the handshake
        return
    await send({"type": "websocket.accept"})
    leg = Leg(session, "client", receive, send, token_id=record.get("token_id", ""))
    leg.slots = json.loads(record.get("slots") or "[]")
    _open[session] = leg
    _watch()
    try:
        code, why = await leg.run()
    finally:
        _open.pop(session, None)
        try:
            await redis_client().delete(alive_key(session, "client"))
        except Exception:
            pass
    await close(send, code, why)
    try:
        await in_pool(sessions.session_ended, record, session, why)
    except Exception:
        log.exception("could not record the end of session %s", session)


async def agent_leg(session: str, scope, receive, send) -> None:
    from apps.nodes.credentials import credential_node

    await receive()  # websocket.connect
    scheme, _, credential = header(scope, b"authorization").partition(" ")
    node = await in_pool(credential_node, credential.strip()) if scheme == "Bearer" else None
    conn = redis_client()
    record = {
        k.decode(): v.decode() for k, v in (await conn.hgetall(sessions.key(session))).items()
    }
    # One agent leg a session, and only the node it was opened on.
    if (
        not node
        or record.get("node") != node
        or not await conn.hsetnx(sessions.key(session), "agent", node)
    ):
        await send({"type": "websocket.close", "code": 4403})
        return
    await send({"type": "websocket.accept"})
    await send({"type": "websocket.send", "text": record["spec"]})
    leg = Leg(session, "agent", receive, send, attempt_id=spec_attempt(record["spec"]))
    try:
        code, why = await leg.run()
    finally:
        try:
            await conn.delete(alive_key(session, "agent"))
        except Exception:
            pass
    await close(send, code, why)
    await end_if_never_claimed(session, record)


def spec_attempt(spec: str) -> int | None:
    try:
        return int(json.loads(spec)["attempt_id"])
    except (ValueError, KeyError, TypeError):
        return None


async def end_if_never_claimed(session: str, record: dict) -> None:
    """The client leg records a session's end; where no client ever presented the ticket (it
    went away after opening the session), this leg does, once it has waited as long as a
    client leg waits for an agent's. A client that comes after that is refused."""
    conn = redis_client()
    deadline = time.monotonic() + ATTACH_SECONDS
    while await conn.hexists(sessions.key(session), "ticket"):
        if time.monotonic() > deadline:
            if await conn.hdel(sessions.key(session), "ticket"):  # taken from a late client
                try:
                    await in_pool(
                        sessions.session_ended, record, session, "the client did not attach"
                    )
                except Exception:
                    log.exception("could not record the end of session %s", session)
            return
        await asyncio.sleep(0.5)


async def close(send, code: int, why: str) -> None:
    try:
        await send({"type": "websocket.close", "code": code, "reason": why[:120]})
    except Exception:
        pass  # the socket is gone already


def _watch() -> None:
    global _watcher
    if _watcher is None or _watcher.done():
        _watcher = asyncio.get_running_loop().create_task(watch())


async def watch() -> None:
    """While this process serves client legs: each beat, end those whose token was revoked
    (within about a second); every RENEW_EVERY beats, renew their records and slots."""
    beats = 0
    while _open:
        await asyncio.sleep(BEAT_SECONDS)
        beats += 1
        legs = dict(_open)
        try:
            revoked = await in_pool(
                sessions.revoked_tokens, {leg.token_id for leg in legs.values()}
            )
            for leg in legs.values():
                if leg.token_id in revoked:
                    leg.end(REVOKED, "the token was revoked")
            if beats % RENEW_EVERY == 0:
                await in_pool(sessions.renew, [(s, leg.slots) for s, leg in legs.items()])
        except Exception:
            log.exception("session watch failed; trying again")
