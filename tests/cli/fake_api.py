"""A small fake of the public API for the client's unit tests: a real HTTP server on loopback
(so the client's own HTTP code runs) that answers from a table and records every request."""

from __future__ import annotations

import dataclasses
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


@dataclasses.dataclass
class Request:
    method: str
    path: str
    headers: dict[str, str]
    body: bytes
    port: int = 0  # the client's: which connection carried it

    def json(self):
        return json.loads(self.body)


DROP = object()  # a route's answer: read the request, then close the connection unanswered


class FakeApi:
    """`routes[(METHOD, path)] = (status, body)` or a callable `(Request) -> (status, body)`;
    body: a dict/list (sent as JSON), str or bytes; an optional third item, extra headers; or
    DROP. Unknown routes answer 404. Connections are kept alive (HTTP/1.1) and closed by the
    server after `idle_seconds` without a request, as a real web server closes them."""

    def __init__(self, idle_seconds: float | None = None):
        self.routes: dict[tuple[str, str], object] = {}
        self.requests: list[Request] = []
        fake = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            timeout = idle_seconds  # the socket's: an idle connection is closed when it expires

            def log_message(self, *args):
                pass

            def _any(self):
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else b""
                request = Request(self.command, self.path, dict(self.headers), body,
                                  self.client_address[1])  # fmt: skip
                fake.requests.append(request)
                route = fake.routes.get((self.command, self.path), (404, {"detail": "Not found."}))
                answer = route(request) if callable(route) else route
                if answer is DROP:
                    self.close_connection = True
                    return
                status, payload, *extra = answer
                if isinstance(payload, dict | list):
                    data, kind = json.dumps(payload).encode(), "application/json"
                elif isinstance(payload, str):
                    data, kind = payload.encode(), "text/plain"
                else:
                    data, kind = payload or b"", "application/octet-stream"
                self.send_response(status)
                self.send_header("Content-Type", kind)
                self.send_header("Content-Length", str(len(data)))
                for name, value in (extra[0] if extra else {}).items():
                    self.send_header(name, value)
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(data)

            do_GET = do_POST = do_PUT = do_DELETE = do_HEAD = _any

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def stop(self):
        self.server.shutdown()
        self.server.server_close()

    def sent(self, method: str, prefix: str = "") -> list[Request]:
        return [r for r in self.requests if r.method == method and r.path.startswith(prefix)]
