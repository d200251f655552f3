"""gpuplatform/asgi.py's bridge to the WSGI views: the request body reaches wsgi.input, a small
response goes out in one piece, a large one in chunks and is closed, lifespan is answered."""

import asyncio
import threading

from gpuplatform.asgi import GATHER_BYTES, build


def call(app, scope: dict, body_parts: list[bytes]) -> list[dict]:
    incoming = [{"type": "http.request", "body": part, "more_body": i < len(body_parts) - 1}
                for i, part in enumerate(body_parts)]  # fmt: skip
    sent = []

    async def receive():
        return incoming.pop(0) if incoming else {"type": "http.disconnect"}

    async def send(message):
        sent.append(message)

    asyncio.run(app(scope, receive, send))
    return sent


def http(path: str, method: str = "GET") -> dict:
    return {"type": "http", "method": method, "path": path, "raw_path": path.encode(), "root_path": "",
            "query_string": b"a=1", "headers": [(b"content-type", b"text/plain"), (b"x-thing", b"yes")],
            "http_version": "1.1", "scheme": "http", "server": ("127.0.0.1", 8000), "client": ("127.0.0.1", 5555)}  # fmt: skip


def test_a_post_body_reaches_the_view_and_the_answer_goes_out_whole():
    seen = {}

    def wsgi(environ, start_response):
        seen.update(body=environ["wsgi.input"].read(), thing=environ["HTTP_X_THING"], query=environ["QUERY_STRING"],
                    addr=environ["REMOTE_ADDR"], method=environ["REQUEST_METHOD"])  # fmt: skip
        start_response("201 Created", [("Content-Type", "application/json"), ("X-Id", "7")])
        return [b'{"ok":', b" true}"]

    sent = call(build(wsgi, threads=2), http("/api/v1/jobs/", "POST"), [b"hello ", b"world"])
    assert seen == {
        "body": b"hello world",
        "thing": "yes",
        "query": "a=1",
        "addr": "127.0.0.1",
        "method": "POST",
    }
    assert sent[0] == {"type": "http.response.start", "status": 201,
                       "headers": [(b"content-type", b"application/json"), (b"x-id", b"7")]}  # fmt: skip
    assert sent[1:] == [{"type": "http.response.body", "body": b'{"ok": true}'}]


def test_a_chunked_body_without_content_length_gets_one_so_django_reads_it():
    seen = {}

    def wsgi(environ, start_response):
        seen.update(length=environ.get("CONTENT_LENGTH"), body=environ["wsgi.input"].read())
        start_response("200 OK", [])
        return [b""]

    call(build(wsgi, threads=1), http("/api/v1/bundles/", "POST"), [b"\x1f\x8b", b"rest"])
    assert seen == {"length": "6", "body": b"\x1f\x8brest"}
    call(build(wsgi, threads=1), http("/api/v1/jobs/"), [b""])
    assert seen == {"length": None, "body": b""}


def test_a_large_answer_goes_out_in_chunks_and_is_closed():
    closed = []

    class Body:
        def __iter__(self):
            for _ in range(8):
                yield b"x" * (GATHER_BYTES // 4)

        def close(self):
            closed.append(True)

    def wsgi(environ, start_response):
        start_response("200 OK", [("Content-Type", "application/octet-stream")])
        return Body()

    sent = call(build(wsgi, threads=2), http("/api/v1/jobs/1/artifacts/big.bin"), [b""])
    bodies = [m for m in sent if m["type"] == "http.response.body"]
    assert len(bodies) > 2 and bodies[-1] == {"type": "http.response.body", "body": b""}
    assert all(m.get("more_body") for m in bodies[:-1])
    assert sum(len(m["body"]) for m in bodies) == 8 * (GATHER_BYTES // 4)
    assert closed == [True]


def test_a_client_gone_before_its_body_came_is_not_served():
    calls = []

    def wsgi(environ, start_response):
        calls.append(1)
        start_response("200 OK", [])
        return [b""]

    assert call(build(wsgi, threads=1), http("/", "POST"), []) == [] and calls == []


def test_lifespan_is_answered():
    messages = [{"type": "lifespan.startup"}, {"type": "lifespan.shutdown"}]
    sent = []

    async def receive():
        return messages.pop(0)

    async def send(message):
        sent.append(message["type"])

    asyncio.run(build(lambda e, s: [], threads=1)({"type": "lifespan"}, receive, send))
    assert sent == ["lifespan.startup.complete", "lifespan.shutdown.complete"]


def test_an_agent_heartbeat_is_served_while_every_thread_of_the_pool_is_busy():
    """A burst of slow submits must not hold an agent's heartbeat past its fence window."""
    release = threading.Event()
    served = []

    def wsgi(environ, start_response):
        if environ["PATH_INFO"] == "/api/v1/jobs/":
            release.wait(10)  # a submit waiting on the database
        served.append((environ["PATH_INFO"], threading.current_thread().name))
        start_response("200 OK", [])
        return [b"{}"]

    app = build(wsgi, threads=2)

    async def scenario():
        async def one(path, method="GET"):
            async def receive():
                return {"type": "http.request", "body": b"", "more_body": False}

            async def send(message):
                pass

            await app(http(path, method), receive, send)

        busy = [asyncio.create_task(one("/api/v1/jobs/", "POST")) for _ in range(2)]
        await asyncio.wait_for(one("/internal/agent/v1/heartbeat/", "POST"), timeout=5)
        assert [path for path, _ in served] == ["/internal/agent/v1/heartbeat/"]
        release.set()
        await asyncio.gather(*busy)

    asyncio.run(scenario())
    assert served[0][1].startswith("wsgi-liveness") and len(served) == 3


def test_a_worker_imports_the_views_as_it_starts_not_at_its_first_request():
    import os
    import subprocess
    import sys

    probe = "import sys, gpuplatform.asgi; print('apps.jobs.api' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True,
                          env=dict(os.environ, DJANGO_SETTINGS_MODULE="gpuplatform.settings"))  # fmt: skip
    assert done.stdout.strip() == "True"
