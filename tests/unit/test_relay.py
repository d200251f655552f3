"""The relay's legs (gpuplatform/relay.py) on a real Redis, without sockets: a full list holds the
sender back, a lost peer or a failed pump ends the session, and frames pass in order."""

import asyncio
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
