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

The config file (`$GPUPLATFORM_CONFIG`, else `~/.config/gpuplatform/config.ini`):

    [default]
    url = http://127.0.0.1:8000
    token = <your API token>
"""

from __future__ import annotations

import builtins
import configparser
import json
import os
import pathlib
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass

DEFAULT_URL = "http://127.0.0.1:8000"
TERMINAL = ("succeeded", "failed", "cancelled")


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
    def __init__(self, url: str = DEFAULT_URL, token: str | None = None, *, timeout: float = 30):
        self.url, self.token, self.timeout = url.rstrip("/"), token, timeout

    @classmethod
    def from_env(cls, profile: str = "default", **kwargs) -> Client:
        url, token = load_settings(profile)
        if not token:
            raise ConfigError(f"no API token: set GPUPLATFORM_TOKEN or put one in {config_path()}")
        return cls(url, token, **kwargs)

    # --- plumbing ---------------------------------------------------------------------------

    def _request(self, method: str, path: str, body: dict | None = None, *, headers: dict | None = None,
                 timeout: float | None = None, data=None):  # fmt: skip
        """`body` is sent as JSON; `data` (bytes or a file-like object, with its own
        Content-Type and Content-Length in `headers`) as it is."""
        if body is not None:
            data = json.dumps(body).encode()
        request = urllib.request.Request(self.url + path, data=data, method=method)
        if self.token:
            request.add_header("Authorization", f"Token {self.token}")
        if body is not None:
            request.add_header("Content-Type", "application/json")
        for name, value in (headers or {}).items():
            request.add_header(name, value)
        try:
            return urllib.request.urlopen(request, timeout=timeout or self.timeout)  # noqa: S310 (http(s) URL from config)
        except urllib.error.HTTPError as error:
            raw = error.read().decode("utf-8", errors="replace")
            try:
                parsed = json.loads(raw)
            except ValueError:
                parsed = raw
            raise ApiError(error.code, parsed, error.headers.get("Retry-After")) from None

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
