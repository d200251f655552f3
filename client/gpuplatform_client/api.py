"""Python SDK for the public API (`/api/v1/`), standard library only.

    from gpuplatform_client import Client   # (also importable as gpuplatform.client in the repo)
    api = Client.from_env()             # GPUPLATFORM_URL / GPUPLATFORM_TOKEN, or the config file
    job = api.submit(template="demo-train", params={"steps": 20}, gpus=1)
    done = api.wait(job["id"])          # follows the job's Server-Sent Events
    api.download(job["id"], "result.json", "out/")

    bundle = pack.pack("my-project")    # gpuplatform_client.pack: a deterministic .tar.gz
    if not api.bundle_exists(bundle.sha256):
        api.upload_bundle(bundle.path)
    api.submit(bundle=bundle.sha256, command=["python", "train.py"], gpus=1)

A Client keeps one connection to the API per thread and reuses it from call to call (a loop of
submits pays one connect, not one a submit); `close()` (or `with Client(...) as api:`) closes
them. Where urllib would send the URL through a proxy (`http_proxy`/`https_proxy`, not
bypassed by `no_proxy`), every call goes through urllib instead, one connection each, as before.

The config file (`$GPUPLATFORM_CONFIG`, else `~/.config/gpuplatform/config.ini`):

    [default]
    url = http://127.0.0.1:8000
    token = <your API token>
"""

from __future__ import annotations

import builtins
import configparser
import contextlib
import http.client
import json
import os
import pathlib
import select
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
import weakref
from collections.abc import Callable, Iterator
from dataclasses import dataclass

DEFAULT_URL = "http://127.0.0.1:8000"
TERMINAL = ("succeeded", "failed", "cancelled")
USER_AGENT = "gpuplatform-client"
# Requests that may be sent again on a new connection when a kept one turns out to be dropped
# (the server closed it as the request went out): sending them twice does what sending once does.
IDEMPOTENT = frozenset({"GET", "HEAD", "PUT", "DELETE", "OPTIONS"})


class ApiError(Exception):
    """The API answered with an error status; `body` is its parsed JSON (or text)."""

    def __init__(self, status: int, body, retry_after: str | None = None):
        super().__init__(f"HTTP {status}: {body}")
        self.status, self.body, self.retry_after = status, body, retry_after


class ConfigError(Exception):
    pass


@dataclass(frozen=True)
class Event:
    """One Server-Sent Event: `state`, `progress`, `log` or `end`."""

    id: str | None
    event: str
    data: dict


def config_path() -> pathlib.Path:
    explicit = os.environ.get("GPUPLATFORM_CONFIG")
    if explicit:
        return pathlib.Path(explicit)
    base = os.environ.get("XDG_CONFIG_HOME") or pathlib.Path.home() / ".config"
    return pathlib.Path(base) / "gpuplatform" / "config.ini"


def load_settings(profile: str = "default") -> tuple[str, str | None]:
    """URL and token: the environment first, then the config file's profile."""
    url, token = os.environ.get("GPUPLATFORM_URL"), os.environ.get("GPUPLATFORM_TOKEN")
    path = config_path()
    if (not url or not token) and path.exists():
        parser = configparser.ConfigParser()
        parser.read(path)
        if parser.has_section(profile):
            url = url or parser.get(profile, "url", fallback=None)
            token = token or parser.get(profile, "token", fallback=None)
    return (url or DEFAULT_URL).rstrip("/"), token


class Client:
    # A request that must not be sent twice (a POST without an Idempotency-Key) goes out on a
    # kept connection only if that connection answered within this many seconds: servers close
    # idle connections after a few seconds (gunicorn's default keep-alive is 2 s, uvicorn's 5),
    # and one that closes as the request goes out leaves the client unable to tell whether the
    # request was acted on. Older connections are replaced before such a request is sent.
    fresh_seconds = 1.0

    def __init__(self, url: str = DEFAULT_URL, token: str | None = None, *, timeout: float = 30):
        self.url, self.token, self.timeout = url.rstrip("/"), token, timeout
        parts = urllib.parse.urlsplit(self.url)
        self._scheme, self._netloc, self._base = parts.scheme, parts.netloc, parts.path
        # urllib's own decision, made once: a proxy for this scheme that no_proxy does not bypass.
        self._proxied = bool(
            urllib.request.getproxies().get(self._scheme)
            and not urllib.request.proxy_bypass(self._netloc)
        )
        self._kept = threading.local()  # .connection: this thread's idle one; .answered; .pid
        # every thread's, for close(); weak: a thread's ends with it (and its socket is closed)
        self._opened: weakref.WeakSet[http.client.HTTPConnection] = weakref.WeakSet()
        self._lock = threading.Lock()

    @classmethod
    def from_env(cls, profile: str = "default", **kwargs) -> Client:
        url, token = load_settings(profile)
        if not token:
            raise ConfigError(f"no API token: set GPUPLATFORM_TOKEN or put one in {config_path()}")
        return cls(url, token, **kwargs)

    def close(self) -> None:
        """Close the connections this client keeps (every thread's); a later call opens anew."""
        with self._lock:
            opened, self._opened = list(self._opened), weakref.WeakSet()
        for connection in opened:
            connection.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __getstate__(self) -> dict:  # a pickled client (multiprocessing) takes no connections
        return {"url": self.url, "token": self.token, "timeout": self.timeout}

    def __setstate__(self, state: dict) -> None:
        self.__init__(state["url"], state["token"], timeout=state["timeout"])  # type: ignore[misc]

    # --- plumbing ---------------------------------------------------------------------------

    @contextlib.contextmanager
    def _request(self, method: str, path: str, body: dict | None = None, *, headers: dict | None = None,
                 timeout: float | None = None, data=None):  # fmt: skip
        """The response, open for reading. `body` is sent as JSON; `data` (bytes or a file-like
        object, with its own Content-Type and Content-Length in `headers`) as it is. Errors: an
        error status raises ApiError; a failure to connect or to send raises urllib.error.URLError
        (as urllib's did), one while waiting for the answer the socket's own error."""
        if body is not None:
            data = json.dumps(body).encode()
        sent = {"User-Agent": USER_AGENT}
        if self.token:
            sent["Authorization"] = f"Token {self.token}"
        if body is not None:
            sent["Content-Type"] = "application/json"
        sent.update(headers or {})
        timeout = timeout or self.timeout
        if self._proxied:
            with self._through_urllib(method, path, data, sent, timeout) as response:
                yield response
            return
        connection, response = self._exchange(method, self._base + path, data, sent, timeout)
        redirected = 300 <= response.status < 400 and method in ("GET", "HEAD")
        try:
            if not redirected:
                if not 200 <= response.status < 300:
                    raise _api_error(response.status, response.read(), response.headers)
                yield response
        finally:
            self._release(connection, response, method)
        if redirected:  # (an http URL sent on to https, say): followed by urllib, as before
            with self._through_urllib(method, path, data, sent, timeout) as followed:
                yield followed

    def _exchange(self, method: str, target: str, data, headers: dict, timeout: float):
        """Send the request on this thread's kept connection (or a new one) and read the answer's
        head. A kept connection the server has closed is replaced before anything is sent. One
        found dropped while sending (the request incomplete, so not acted on), or, for a request
        that may be sent twice, while waiting for the answer, is replaced once and the request
        sent again; a POST without an Idempotency-Key whose request went out whole is never sent
        again (the server may have acted on it): its error is raised."""
        once = method in IDEMPOTENT or any(k.lower() == "idempotency-key" for k in headers)
        replayable = data is None or isinstance(data, bytes)  # a file body is read as it goes
        connection, kept = self._connection(timeout, kept_for_long=once)
        while True:
            try:
                connection.request(method, target, body=data, headers=headers)
            except BaseException as error:
                self._forget(connection)
                if not isinstance(error, OSError):
                    raise
                if kept and replayable:
                    connection, kept = self._open(timeout), False
                    continue
                raise urllib.error.URLError(error) from error  # as urllib's: cannot reach
            try:
                return connection, connection.getresponse()
            except BaseException as error:
                self._forget(connection)
                if kept and replayable and once and isinstance(error, ConnectionError):
                    connection, kept = self._open(timeout), False
                    continue
                raise

    def _connection(self, timeout: float, *, kept_for_long: bool):
        """This thread's idle connection if the server has not closed it (nothing to read on it:
        a closed one reads as its end), else a new one; and whether it was kept."""
        kept = self._kept
        connection = getattr(kept, "connection", None)
        kept.connection = None  # in use: a call made while its answer is read opens another
        if connection is not None:
            stale = not kept_for_long and time.monotonic() - kept.answered > self.fresh_seconds
            if kept.pid != os.getpid():  # forked: the parent's socket is not ours to use
                connection = None
            elif stale or connection.sock is None or _readable(connection.sock):
                self._forget(connection)
                connection = None
        if connection is None:
            return self._open(timeout), False
        connection.timeout = timeout
        connection.sock.settimeout(timeout)
        return connection, True

    def _open(self, timeout: float) -> http.client.HTTPConnection:
        """A new connection (it connects when the request is sent). https: the default SSL
        context, as urllib's (certificates checked against the system's, the host name too)."""
        if self._scheme == "https":
            connection: http.client.HTTPConnection = http.client.HTTPSConnection(
                self._netloc, timeout=timeout
            )
        else:
            connection = http.client.HTTPConnection(self._netloc, timeout=timeout)
        with self._lock:
            self._opened.add(connection)
        return connection

    def _release(self, connection: http.client.HTTPConnection, response, method: str) -> None:
        """Keep the connection for this thread's next call if its answer was read to the end and
        the server keeps it open; else close it (an answer left unread would be read as the
        next one's)."""
        if not response.isclosed() and (method == "HEAD" or response.status in (204, 304)):
            response.read()  # no body: this only marks the answer done
        if not response.isclosed() or connection.sock is None:
            self._forget(connection)
        elif getattr(self._kept, "connection", None) is None:
            self._kept.connection, self._kept.pid = connection, os.getpid()
            self._kept.answered = time.monotonic()
        else:
            self._forget(connection)  # this thread already keeps one (a call inside a stream)

    def _forget(self, connection: http.client.HTTPConnection) -> None:
        connection.close()
        with self._lock:
            self._opened.discard(connection)

    @contextlib.contextmanager
    def _through_urllib(self, method: str, path: str, data, headers: dict, timeout: float):
        """One request through urllib.request: its proxies, its redirects, a connection each."""
        request = urllib.request.Request(self.url + path, data=data, method=method, headers=headers)
        try:
            response = urllib.request.urlopen(request, timeout=timeout)  # noqa: S310 (http(s) URL from config)
        except urllib.error.HTTPError as error:
            raise _api_error(error.code, error.read(), error.headers) from None
        with response:
            yield response

    def _json(self, method: str, path: str, body: dict | None = None, **kwargs):
        with self._request(method, path, body, **kwargs) as response:
            return json.loads(response.read() or b"null")

    # --- the API ------------------------------------------------------------------------------

    def submit(self, *, idempotency_key: str | None = None, **body) -> dict:
        headers = {"Idempotency-Key": idempotency_key} if idempotency_key else None
        return self._json("POST", "/api/v1/jobs/", body, headers=headers)

    def list(
        self, *, state: str | None = None, tier: str | None = None, page: int | None = None,
        array: str | None = None, page_size: int | None = None,
    ) -> dict:  # fmt: skip
        filters = {
            "state": state,
            "tier": tier,
            "page": page,
            "array": array,
            "page_size": page_size,
        }
        query = urllib.parse.urlencode({k: v for k, v in filters.items() if v})
        return self._json("GET", "/api/v1/jobs/" + (f"?{query}" if query else ""))

    def get(self, job_id: str) -> dict:
        return self._json("GET", f"/api/v1/jobs/{job_id}/")

    def cancel(self, job_id: str) -> dict:
        return self._json("POST", f"/api/v1/jobs/{job_id}/cancel/")

    def logs(self, job_id: str, rank: int | None = None, attempt: int | None = None) -> str:
        """The job's log: gang member `rank`'s (default 0), every attempt's or one `attempt`'s."""
        query = urllib.parse.urlencode(
            {k: v for k, v in {"rank": rank, "attempt": attempt}.items() if v is not None}
        )
        path = f"/api/v1/jobs/{job_id}/logs/" + (f"?{query}" if query else "")
        with self._request("GET", path) as response:
            return response.read().decode("utf-8", errors="replace")

    def artifacts(self, job_id: str) -> builtins.list[dict]:  # `list` here is Client.list
        return self._json("GET", f"/api/v1/jobs/{job_id}/artifacts/")

    def download(self, job_id: str, name: str, directory: str | os.PathLike = ".") -> pathlib.Path:
        target = pathlib.Path(directory) / pathlib.PurePosixPath(name).name
        target.parent.mkdir(parents=True, exist_ok=True)
        quoted = urllib.parse.quote(name)
        with (
            self._request("GET", f"/api/v1/jobs/{job_id}/artifacts/{quoted}") as response,
            open(target, "wb") as out,
        ):
            while chunk := response.read(1 << 16):
                out.write(chunk)
        return target

    def open_session(self, job_id: str, body: dict) -> dict:
        """An interactive session on a running job (docs/interactive.md): its id, the one-use
        ticket its websocket presents, and the node."""
        return self._json("POST", f"/api/v1/jobs/{job_id}/sessions/", body, timeout=30)

    def usage(self) -> dict:
        return self._json("GET", "/api/v1/usage/")

    def templates(self) -> builtins.list[dict]:
        """The job templates a submit may name, each with its parameters."""
        return self._json("GET", "/api/v1/templates/")

    def capacity(self) -> builtins.list[dict]:
        """Per GPU SKU: ready nodes, GPUs, free GPUs, the most free on one node."""
        return self._json("GET", "/api/v1/capacity/")["skus"]

    # --- code bundles ---------------------------------------------------------------------------

    def bundle_exists(self, sha256: str) -> bool:
        """`HEAD /api/v1/bundles/{sha256}/`: True if this tenant has already uploaded it."""
        try:
            with self._request("HEAD", f"/api/v1/bundles/{sha256}/"):
                return True
        except ApiError as error:
            if error.status == 404:
                return False
            raise

    def upload_bundle(self, path: str | os.PathLike, *,
                      progress: Callable[[int, int], None] | None = None,
                      timeout: float | None = None) -> dict:  # fmt: skip
        """Stream the archive at `path` (.tar.gz or .zip) to `POST /api/v1/bundles/`; `progress`
        is called with (bytes sent, total) as it goes. Answers `{"sha256", "size", ...}`."""
        path = pathlib.Path(path)
        size = path.stat().st_size
        kind = "application/zip" if path.suffix == ".zip" else "application/gzip"
        headers = {"Content-Type": kind, "Content-Length": str(size)}
        with open(path, "rb") as handle:
            body = _Progress(handle, size, progress)
            with self._request("POST", "/api/v1/bundles/", data=body, headers=headers,
                               timeout=timeout or max(self.timeout, 600)) as response:  # fmt: skip
                return json.loads(response.read() or b"null")

    # --- secrets (names and dates only: values are write-only) ---------------------------------

    def secrets(self) -> builtins.list[dict]:
        page = self._json("GET", "/api/v1/secrets/")
        return page["results"] if isinstance(page, dict) and "results" in page else page

    def set_secret(self, name: str, value: str) -> dict:
        """Create the tenant secret `name`, or replace its value (tenant admins only)."""
        quoted = urllib.parse.quote(name, safe="")
        try:
            return self._json("PUT", f"/api/v1/secrets/{quoted}/", {"value": value})
        except ApiError as error:
            if error.status not in (404, 405):
                raise
        return self._json("POST", "/api/v1/secrets/", {"name": name, "value": value})

    def delete_secret(self, name: str) -> None:
        quoted = urllib.parse.quote(name, safe="")
        with self._request("DELETE", f"/api/v1/secrets/{quoted}/"):
            pass

    # --- arrays ---------------------------------------------------------------------------------

    def array(self, array_id: str) -> dict:
        return self._json("GET", f"/api/v1/arrays/{array_id}/")

    def cancel_array(self, array_id: str) -> dict:
        return self._json("POST", f"/api/v1/arrays/{array_id}/cancel/")

    def tasks(self, array_id: str) -> Iterator[dict]:
        """Every task of the array in index order (a task not made yet has `id` None)."""
        page = 1
        while True:
            answer = self.list(array=array_id, page=page, page_size=1000)
            yield from answer["results"]
            if not answer.get("next"):
                return
            page += 1

    def wait_array(self, array_id: str, *, timeout: float | None = None, interval: float = 2,
                   on_change: Callable[[dict], None] | None = None) -> dict:  # fmt: skip
        """Poll the array until every task is terminal; return its last state."""
        deadline = time.monotonic() + timeout if timeout else None
        last = None
        while True:
            array = self.array(array_id)
            counts = array.get("counts") or {}
            if counts != last and on_change is not None:
                on_change(array)
            last = counts
            if array.get("state") in ("ended", "cancelled"):
                return array
            if sum(counts.get(s, 0) for s in TERMINAL) >= array.get("size", 0) > 0:
                return array
            if deadline is not None and time.monotonic() > deadline:
                raise TimeoutError(f"array {array_id} did not end in time")
            time.sleep(interval)

    # --- live status ----------------------------------------------------------------------------

    def events(
        self, job_id: str, *, last_event_id: str | None = None, timeout: float = 30
    ) -> Iterator[Event]:
        """One connection's worth of events (the server closes after `timeout` seconds)."""
        headers = {"Accept": "text/event-stream"}
        if last_event_id:
            headers["Last-Event-ID"] = last_event_id
        path = f"/api/v1/jobs/{job_id}/events/?timeout={timeout:g}"
        with self._request("GET", path, headers=headers, timeout=timeout + 30) as response:
            yield from parse_sse(response)

    def follow(
        self, job_id: str, *, deadline: float | None = None, stream_seconds: float = 30
    ) -> Iterator[Event]:
        """Every event of the job until it ends, reconnecting where the last stream stopped."""
        last_id = None
        while deadline is None or time.monotonic() < deadline:
            try:
                for event in self.events(job_id, last_event_id=last_id, timeout=stream_seconds):
                    last_id = event.id or last_id
                    yield event
                    if event.event == "end":
                        return
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                time.sleep(1)  # the web restarting or a dropped connection: resume from last_id
            time.sleep(0.2)
        raise TimeoutError(f"job {job_id} did not end in time")

    def wait(self, job_id: str, *, timeout: float | None = None,
             on_event: Callable[[Event], None] | None = None) -> dict:  # fmt: skip
        """Follow the job's events until it is terminal; return the finished job."""
        deadline = time.monotonic() + timeout if timeout else None
        for event in self.follow(job_id, deadline=deadline):
            if on_event is not None:
                on_event(event)
        return self.get(job_id)


def _api_error(status: int, raw: bytes, headers) -> ApiError:
    text = raw.decode("utf-8", errors="replace")
    try:
        parsed = json.loads(text)
    except ValueError:
        parsed = text
    return ApiError(status, parsed, headers.get("Retry-After"))


def _readable(sock) -> bool:
    """Whether the socket has something to read without waiting: on an idle kept connection,
    the server's close (or bytes nobody asked for); either way it cannot carry a request."""
    if hasattr(select, "poll"):
        poller = select.poll()
        poller.register(sock, select.POLLIN)
        return bool(poller.poll(0))
    return bool(select.select([sock], [], [], 0)[0])


def parse_sse(lines) -> Iterator[Event]:
    """Server-Sent Events from an iterable of byte lines (the text/event-stream format)."""
    fields: dict[str, str] = {}
    data: list[str] = []
    for raw in lines:
        line = raw.decode("utf-8", errors="replace").rstrip("\r\n")
        if not line:
            if data and "event" in fields:
                yield Event(fields.get("id"), fields["event"], json.loads("\n".join(data)))
            fields, data = {}, []
            continue
        if line.startswith(":"):
            continue
        key, _, value = line.partition(":")
        value = value[1:] if value.startswith(" ") else value
        if key == "data":
            data.append(value)
        else:
            fields[key] = value


class _Progress:
    """A file wrapper that counts what http.client reads from it."""

    def __init__(self, handle, total: int, callback: Callable[[int, int], None] | None):
        self.handle, self.total, self.callback, self.sent = handle, total, callback, 0

    def read(self, size: int = -1) -> bytes:
        chunk = self.handle.read(size if size and size > 0 else 1 << 16)
        self.sent += len(chunk)
        if self.callback is not None:
            self.callback(self.sent, self.total)
        return chunk

    def __len__(self) -> int:
        return self.total
