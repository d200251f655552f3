"""Test receivers on loopback that count the requests reaching them."""

from __future__ import annotations

import http.server
import threading


class Counter:
    """Answers `status` (and `location`, for a redirect); counts every request; can hold each
    request until `release` is set (a slow receiver)."""

    def __init__(self, *, status: int = 200, location: str | None = None, hold: bool = False):
        self.status, self.location = status, location
        self.hits: list[dict] = []
        self.arrived = threading.Condition()
        self.entered = threading.Event()  # a request arrived (set before any holding)
        self.release = threading.Event()
        if not hold:
            self.release.set()
        receiver = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def _answer(self):
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else b""
                hit = {
                    "method": self.command,
                    "path": self.path,
                    "headers": dict(self.headers),
                    "body": body,
                }
                with receiver.arrived:
                    receiver.hits.append(hit)
                    receiver.arrived.notify_all()
                receiver.entered.set()
                receiver.release.wait(60)
                self.send_response(receiver.status)
                if receiver.location:
                    self.send_header("Location", receiver.location)
                self.send_header("Content-Length", "0")
                self.end_headers()

            do_GET = do_POST = _answer

            def log_message(self, *args):
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.port = self.server.server_address[1]
        self.url = f"http://127.0.0.1:{self.port}/hook"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def wait_hits(self, count: int, timeout: float = 30) -> bool:
        """Whether `count` requests have arrived (waiting up to `timeout`, a failure guard only)."""
        with self.arrived:
            return self.arrived.wait_for(lambda: len(self.hits) >= count, timeout)

    def stop(self):
        self.release.set()
        self.server.shutdown()
        self.server.server_close()
