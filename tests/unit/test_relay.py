"""The relay's legs (gpuplatform/relay.py) on a real Redis, without sockets: a full list holds the
sender back, a lost peer or a failed pump ends the session, and frames pass in order."""

import asyncio
import time
import uuid

import pytest

from gpuplatform import relay


def run(coroutine):
    return asyncio.run(asyncio.wait_for(coroutine, timeout=30))


def fresh() -> str:
    return uuid.uuid4().hex


class Socket:
    """An ASGI websocket's two callables: `incoming` frames in, what the leg sends kept."""

    def __init__(self, incoming=(), *, then_wait=True, fail=None):
        self.incoming, self.sent, self.then_wait, self.fail = list(incoming), [], then_wait, fail

    async def receive(self):
        if self.fail:
            raise self.fail
        if self.incoming:
            return {"type": "websocket.receive", "bytes": self.incoming.pop(0)}
        if self.then_wait:
            await asyncio.sleep(3600)
        return {"type": "websocket.disconnect", "code": 1000}

    async def send(self, message):
        self.sent.append(message)


@pytest.fixture(autouse=True)
def _fresh_clients():
    relay._redis.clear()  # one client per event loop: each test runs its own loop
    yield
    relay._redis.clear()


def test_a_full_list_holds_the_sender_back(monkeypatch):
    async def scenario():
        leg = relay.Leg(fresh(), "agent", Socket().receive, Socket().send)
        for _ in range(relay.HIGH_WATER):
            await leg.push(relay.DATA + b"x")
        with pytest.raises(TimeoutError):  # nobody drains it: the next push waits
            await asyncio.wait_for(leg.push(relay.DATA + b"x"), timeout=1)
        return await relay.redis_client().llen(leg.outbox)

    assert run(scenario()) <= relay.HIGH_WATER + 1


def test_frames_pass_in_order_and_the_end_follows_them():
    async def scenario():
        session = fresh()
        agent = Socket([b"\x00one", b"\x00two", b"\x01{}"], then_wait=False)
        agent_leg = relay.Leg(session, "agent", agent.receive, agent.send)
        client = Socket()
        client_leg = relay.Leg(session, "client", client.receive, client.send)
        ended = await asyncio.gather(agent_leg.run(), client_leg.run())
        return ended, [m["bytes"] for m in client.sent]

    ended, received = run(scenario())
    assert received == [b"\x00one", b"\x00two", b"\x01{}"]
    assert ended[0] == (relay.ENDED, "the agent left") and ended[1] == (
        relay.ENDED,
        "the agent left",
    )


def test_a_failed_pump_ends_the_session(monkeypatch):
    async def scenario():
        socket = Socket(fail=RuntimeError("boom"))
        return await relay.Leg(fresh(), "client", socket.receive, socket.send).run()

    assert run(scenario()) == (1011, "the relay failed")


def test_a_peer_whose_heartbeat_lapsed_ends_the_session(monkeypatch):
    async def scenario():
        socket = Socket()
        leg = relay.Leg(fresh(), "client", socket.receive, socket.send)
        leg.peer_seen = True  # the agent was there, and its web process is gone now
        return await leg.run()

    code, why = run(scenario())
    assert code == relay.PEER_GONE and "lost" in why


def activity_after(*, typed=(), printed=()) -> float | None:
    """What the attempt's activity says once the legs passed these frames, client -> agent and
    agent -> client."""
    from apps.platform import session_activity

    attempt = uuid.uuid4().int % 10**9

    async def scenario():
        session = fresh()
        client, agent = Socket(list(typed)), Socket(list(printed))
        legs = [relay.Leg(session, "client", client.receive, client.send),
                relay.Leg(session, "agent", agent.receive, agent.send, attempt_id=attempt)]  # fmt: skip
        tasks = [asyncio.create_task(leg.run()) for leg in legs]
        for _ in range(100):
            await asyncio.sleep(0.02)
            if len(agent.sent) == len(typed) and len(client.sent) == len(printed):
                break
        await asyncio.sleep(0.1)
        for leg in legs:
            leg.end(relay.ENDED, "done")
        await asyncio.gather(*tasks)
        value = await relay.redis_client().get(session_activity.key(attempt))
        return None if value is None else float(value)

    return run(scenario())


def test_a_byte_either_way_marks_the_attempts_activity_for_every_ranks_idle_timeout():
    before = time.time()
    assert activity_after() is None
    typed = activity_after(typed=[b"\x00ls\r"])
    printed = activity_after(printed=[b"\x00output"])
    assert typed is not None and printed is not None and before <= typed <= printed <= time.time()


def test_a_busy_leg_marks_its_attempt_at_most_once_a_second():
    from apps.platform import session_activity

    async def scenario():
        leg = relay.Leg(fresh(), "agent", Socket().receive, Socket().send, attempt_id=7_000_001)
        conn, key = relay.redis_client(), session_activity.key(7_000_001)
        await conn.delete(key)
        await leg.mark_active()
        first = await conn.get(key)
        await conn.delete(key)
        await leg.mark_active()  # within the second: not written
        return first, await conn.get(key)

    first, second = run(scenario())
    assert first is not None and second is None
