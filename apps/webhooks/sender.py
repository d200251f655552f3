"""One POST to a webhook receiver, to the address the guard checked and nothing else.

- The host is resolved and checked now (`guard.checked_address`), and the TCP connection goes to
  that address; the Host header and TLS SNI (and certificate check) carry the name. No second
  lookup happens between check and connect, so DNS cannot swap the address in between.
- Redirects are never followed (http.client does not): a 3xx is a failed delivery.
- The whole exchange has one deadline (`TOTAL_SECONDS`, connect to last byte): a watchdog shuts
  the socket when it passes, so a receiver trickling its headers cannot hold a worker longer.
- At most `READ_LIMIT` bytes of the body are read, and none of it is kept: only the status code.
- Errors are described in our own words (`Outcome.error`), never the receiver's.
"""

from __future__ import annotations

import http.client
import socket
import ssl
import threading
from dataclasses import dataclass

from apps.webhooks.guard import Address, Target, WebhookRefused, checked_address

TOTAL_SECONDS = 5.0
CONNECT_SECONDS = 3.0
READ_LIMIT = 4096


@dataclass(frozen=True)
class Outcome:
    status: int | None  # the receiver's status code, None when no answer came
    error: str  # "" on a 2xx; otherwise why it failed, in our words

    @property
    def ok(self) -> bool:
        return self.status is not None and 200 <= self.status < 300


class _PinnedHTTP(http.client.HTTPConnection):
    def __init__(self, target: Target, address: Address, timeout: float):
        super().__init__(target.host, target.port, timeout=timeout)
        self._address = str(address)

    def connect(self):
        self.sock = _connect(self._address, self.port, self.timeout)


class _PinnedHTTPS(http.client.HTTPSConnection):
    def __init__(self, target: Target, address: Address, timeout: float):
        super().__init__(
            target.host, target.port, timeout=timeout, context=ssl.create_default_context()
        )
        self._address = str(address)

    def connect(self):
        raw = _connect(self._address, self.port, self.timeout)
        self.sock = self._context.wrap_socket(raw, server_hostname=self.host)


def _connect(address: str, port: int, total: float) -> socket.socket:
    sock = socket.create_connection((address, port), min(CONNECT_SECONDS, total))
    sock.settimeout(total)  # each read; the watchdog bounds them all together
    return sock


def post(url: str, body: bytes, headers: dict[str, str], *, total: float | None = None) -> Outcome:
    total = total or TOTAL_SECONDS  # read now, so a test can hold a receiver longer
    try:
        target, address = checked_address(url)
    except WebhookRefused as refused:
        return Outcome(None, f"refused: {refused}")
    cls = _PinnedHTTPS if target.scheme == "https" else _PinnedHTTP
    conn = cls(target, address, timeout=total)
    cut = threading.Event()
    watchdog = threading.Timer(total, _cut, args=(conn, cut))
    watchdog.daemon = True
    watchdog.start()
    late = Outcome(None, f"no answer within {total:g} s")
    try:
        conn.request("POST", target.path, body=body, headers=headers)
        response = conn.getresponse()
        response.read(READ_LIMIT)  # politeness only; not kept
        status = response.status
    except ssl.SSLError:
        return Outcome(None, "TLS handshake or certificate check failed")
    except ConnectionRefusedError:
        return Outcome(None, "connection refused")
    except TimeoutError:
        return late
    except (OSError, http.client.HTTPException):
        return (
            late if cut.is_set() else Outcome(None, "connection failed or the answer was not HTTP")
        )
    finally:
        watchdog.cancel()
        conn.close()
    if cut.is_set():  # a cut mid-headers reads as their end to http.client: not an answer
        return late
    if 300 <= status < 400:
        return Outcome(status, f"redirect ({status}) not followed")
    if not 200 <= status < 300:
        return Outcome(status, f"HTTP {status}")
    return Outcome(status, "")


def _cut(conn: http.client.HTTPConnection, cut: threading.Event) -> None:
    cut.set()
    sock = conn.sock
    if sock is not None:
        try:
            sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
