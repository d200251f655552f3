"""The agent's side of the agent API (`/internal/agent/v1/`, apps/nodes/agent_api.py), over HTTP
with `requests`. No Django: the agent holds only the web's URL and its node credential."""

from __future__ import annotations

import logging
import os
import pathlib
import tempfile
import urllib.parse
from collections.abc import Iterator
from typing import BinaryIO

import requests

from apps.platform import agent_protocol as wire

log = logging.getLogger(__name__)


class ApiError(RuntimeError):
    """The control plane answered something other than what the call expects (or not at all)."""

    def __init__(self, message: str, status: int | None = None):
        super().__init__(message)
        self.status = status


class CredentialRefused(ApiError):
    """401: the credential is unknown, revoked or expired. The agent keeps retrying (and fences)."""


class TooLarge(ApiError):
    """413: past the platform's size cap for a log, an artifact or a checkpoint."""


class AgentApi:
    def __init__(self, base_url: str, credential: str, *, session=None, timeout: float = 30.0):
        self.base = base_url.rstrip("/") + wire.API_PREFIX
        self.timeout = timeout
        self.session = session if session is not None else environment_read_once(self.base)
        self.session.headers["Authorization"] = f"{wire.AUTH_SCHEME} {credential}"
        # The last heartbeat answer's members and their digest (sent back: unchanged, not resent).
        self._members: tuple[str, dict[tuple[int, int], wire.Assignment]] = ("", {})

    # --- plumbing ---------------------------------------------------------------------------

    def _call(self, method: str, path: str, *, token: str | None = None, headers: dict | None = None,
              ok=(200, 201, 204), **kwargs):  # fmt: skip
        headers = dict(headers or {})
        if token is not None:
            headers[wire.ATTEMPT_TOKEN_HEADER] = token
        try:
            response = self.session.request(
                method, self.base + path, headers=headers, timeout=self.timeout, **kwargs
            )
        except requests.RequestException as error:
            raise ApiError(f"{method} {path}: {error}") from error
        if response.status_code in ok:
            return response
        detail = response.text[:300]
        if response.status_code == 401:
            raise CredentialRefused(f"{method} {path}: 401 {detail}", 401)
        if response.status_code == 413:
            raise TooLarge(f"{method} {path}: 413 {detail}", 413)
        raise ApiError(f"{method} {path}: {response.status_code} {detail}", response.status_code)

    @staticmethod
    def _member(a: wire.Assignment) -> str:
        return f"/members/{a.attempt_id}/{a.rank}/"

    # --- node -----------------------------------------------------------------------------------

    def register(self, *, node: str, agent_instance: str, sku: str, gpus: list[wire.GpuInfo], labels: dict,
                 hostname: str, isolation: str) -> dict:  # fmt: skip
        body = {"node": node, "agent_instance": agent_instance, "sku": sku, "labels": labels, "hostname": hostname,
                "isolation": isolation, "gpus": [wire.to_wire(g) for g in gpus]}  # fmt: skip
        return self._call("POST", "/register/", json=body).json()

    def heartbeat(self, *, agent_instance: str, gpus: list[wire.GpuInfo],
                  samples: list[dict] | None = None) -> dict | None:  # fmt: skip
        """The members open on this node (as `assignments()`), or None when another agent
        instance has taken this node over (this one must stop). `samples`: the GPU samples
        taken since the last heartbeat (workers/telemetry.py)."""
        digest, known = self._members
        body = {
            "agent_instance": agent_instance,
            "gpus": [wire.to_wire(g) for g in gpus],
            "members_digest": digest,
        }
        if samples:
            body["samples"] = samples
        answer = self._call("POST", "/heartbeat/", json=body).json()
        if answer["replaced"]:
            return None
        if answer.get("unchanged") and digest and answer.get("members_digest") == digest:
            return dict(known)  # what the platform has here is what its last answer said
        members = _by_key(answer["members"])
        self._members = (answer.get("members_digest", ""), members)
        return dict(members)

    def assignments(
        self, attempts: list[int] | None = None
    ) -> dict[tuple[int, int], wire.Assignment]:
        """The members open on this node; with `attempts`, those attempts' members here (ended
        ones too, `active` says), each with its `resume_from`: a start message's check."""
        if attempts is None:
            return _by_key(self._call("GET", "/assignments/").json()["members"])
        query = ",".join(str(a) for a in sorted(set(attempts)))
        return _by_key(self._call("GET", f"/assignments/?attempts={query}").json()["members"])

    def assignment(self, attempt_id: int, rank: int, token: str) -> wire.Assignment | None:
        """The member if the platform has it placed on this node under this token, else None."""
        response = self._call("GET", f"/members/{attempt_id}/{rank}/", token=token, ok=(200, 404))
        return wire.assignment_from_wire(response.json()) if response.status_code == 200 else None

    # --- reports (each fenced by the attempt token) -------------------------------------------------

    def report(self, a: wire.Assignment, kind: str, **body) -> bool:
        """started / progress / finished / lost. False: refused (stale token, ended, not placed here)."""
        response = self._call(
            "POST", self._member(a) + f"{kind}/", token=a.token, json=body, ok=(200, 404)
        )
        return response.status_code == 200 and bool(response.json().get("accepted"))

    def reports(self, items: list[dict]) -> list[dict]:
        """Several members' reports in one call (`POST /reports/`): each item has attempt_id,
        rank, token, kind and the kind's fields; the answer has one result per item, in order
        (`{"status": 200, "accepted": bool}`, or 404 / 400 / 500 for that item alone)."""
        results = self._call("POST", "/reports/", json={"reports": items}).json()["results"]
        if len(results) != len(items):
            raise ApiError(f"POST /reports/: {len(results)} results for {len(items)} reports")
        return results

    def append_log(self, a: wire.Assignment, offset: int, chunk: bytes) -> tuple[bool, int]:
        """(appended, the stored log's size): not appended when the stored log does not end at `offset`."""
        response = self._call("POST", self._member(a) + "log/", token=a.token, data=chunk, ok=(200, 409),
                              headers={wire.LOG_OFFSET_HEADER: str(offset),
                                       "Content-Type": "application/octet-stream"})  # fmt: skip
        return response.status_code == 200, int(response.json()["size"])

    # Uploads pass the open file itself: requests streams it with its Content-Length (Django reads
    # no chunked request body), never reading it whole into memory.

    def put_artifact(self, a: wire.Assignment, name: str, source: BinaryIO) -> bool:
        path = self._member(a) + "artifacts/" + urllib.parse.quote(name, safe="/")
        response = self._call("PUT", path, token=a.token, data=source,
                              headers={"Content-Type": "application/octet-stream"})  # fmt: skip
        return bool(response.json().get("stored"))

    def put_checkpoint(self, a: wire.Assignment, filename: str, source: BinaryIO) -> str:
        """Store the member's checkpoint file; returns its name in the platform's storage."""
        response = self._call("PUT", self._member(a) + "checkpoint/", token=a.token, data=source,
                              headers={wire.CHECKPOINT_NAME_HEADER: filename,
                                       "Content-Type": "application/octet-stream"})  # fmt: skip
        return response.json()["checkpoint"]

    def get_checkpoint(self, a: wire.Assignment, dest_dir: pathlib.Path) -> str:
        """Download the checkpoint this member resumes from into dest_dir; its path, or "" if none."""
        response = self._call(
            "GET", self._member(a) + "checkpoint/", token=a.token, stream=True, ok=(200, 204)
        )
        if response.status_code == 204:
            return ""
        name = pathlib.PurePosixPath(
            response.headers.get(wire.CHECKPOINT_NAME_HEADER) or "checkpoint"
        ).name
        dest_dir.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=dest_dir, prefix=".download.")
        with os.fdopen(fd, "wb") as out:
            for chunk in response.iter_content(1 << 20):
                out.write(chunk)
        target = dest_dir / (name if name not in ("", ".", "..") else "checkpoint")
        os.replace(tmp, target)
        return str(target)

    # --- own code (docs/own-code.md) ------------------------------------------------------------

    def stream_bundle(self, a: wire.Assignment, chunk_size: int = 1 << 20) -> Iterator[bytes]:
        """The member's code bundle, chunk by chunk as it arrives (the caller verifies its
        sha256). ApiError with the status (404: the attempt or its bundle is gone)."""
        response = self._call("GET", self._member(a) + "bundle/", token=a.token, stream=True)
        with response:
            try:
                yield from response.iter_content(chunk_size)
            except requests.RequestException as error:
                raise ApiError(f"GET {self._member(a)}bundle/: {error}") from error

    def get_secrets(self, a: wire.Assignment) -> dict[str, str]:
        """The values of the member's secrets, by name: held in memory only, never written."""
        response = self._call("GET", self._member(a) + "secrets/", token=a.token)
        secrets = response.json().get("secrets")
        if not isinstance(secrets, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in secrets.items()
        ):
            raise ApiError(f"GET {self._member(a)}secrets/: not a name -> value object", 200)
        return secrets

    def get_image_auth(self, a: wire.Assignment) -> str | None:
        """The registry's `user:password` for the member's image (memory only), or None."""
        response = self._call("GET", self._member(a) + "image/", token=a.token)
        auth = response.json().get("auth")
        if auth is not None and not isinstance(auth, str):
            raise ApiError(f"GET {self._member(a)}image/: auth is not a string", 200)
        return auth

    def report_image_digest(self, a: wire.Assignment, digest: str) -> str:
        """Report the digest this member's pull resolved; the job's fixed one comes back."""
        response = self._call(
            "POST", self._member(a) + "image/", token=a.token, json={"digest": digest}
        )
        return str(response.json().get("image_digest") or "")

    def session_quiet_for(self, a: wire.Assignment) -> float | None:
        """Seconds since any session of the member's attempt, on any rank, carried a byte (the
        relay records it), or None when none has: an interactive gang's idle timeout."""
        response = self._call("GET", self._member(a) + "activity/", token=a.token)
        quiet = response.json()["quiet_seconds"]
        return None if quiet is None else float(quiet)

    def list_inputs(self, a: wire.Assignment) -> list[dict]:
        """The artifacts of the member's job's parents: [{"job", "name", "size", "sha256"}]."""
        return self._call("GET", self._member(a) + "inputs/", token=a.token).json()["inputs"]

    def get_input(self, a: wire.Assignment, job_id: str, name: str, target: pathlib.Path) -> None:
        """Download one of them to `target` (written whole, then renamed into place)."""
        path = self._member(a) + f"inputs/{job_id}/" + urllib.parse.quote(name, safe="/")
        response = self._call("GET", path, token=a.token, stream=True)
        target.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=".download.")
        with os.fdopen(fd, "wb") as out:
            for chunk in response.iter_content(1 << 20):
                out.write(chunk)
        os.replace(tmp, target)


def environment_read_once(base: str) -> requests.Session:
    """A `requests.Session` for the agent API at `base`, given once what requests would otherwise
    look up in the environment on every call (`trust_env`): the proxies for the web's address
    (HTTP(S)_PROXY, NO_PROXY) and the CA bundle (REQUESTS_CA_BUNDLE, CURL_CA_BUNDLE); the same
    settings, read at the agent's start. Every call goes to the one web, so the proxy decision for
    its host is the same for all of them. What is left out is `.netrc`: its credentials would
    replace the node credential's Authorization header, which no agent can have wanted. Those
    look-ups were ~0.16 ms of the agent's CPU a call, 1.40 -> 1.24 ms in interleaved pairs
    (docs/bench/71-slurm-peer-notes.md, h39agent)."""
    session = requests.Session()
    # requests' own reading of the environment for this URL, as each call made it until now.
    settings = session.merge_environment_settings(base, {}, None, None, None)
    session.proxies.update(settings["proxies"])
    session.verify = settings["verify"]
    session.trust_env = False
    return session


def _by_key(members: list[dict]) -> dict[tuple[int, int], wire.Assignment]:
    return {(m["attempt_id"], m["rank"]): wire.assignment_from_wire(m) for m in members}
