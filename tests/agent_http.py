"""The agent's HTTP client (workers/agent_client.py) against the real agent API views, in
process: a `requests.Session` stand-in that sends each call through Django's test client."""

from __future__ import annotations

import json as jsonlib
import urllib.parse

from django.test import Client

from workers.agent_client import AgentApi

BASE = "http://testserver"


class _Response:
    def __init__(self, response):
        self._response = response
        self.status_code = response.status_code
        self.headers = response.headers
        if getattr(response, "streaming", False):
            self.content = b"".join(response.streaming_content)
        else:
            self.content = response.content
        self.text = self.content.decode(errors="replace")

    def json(self):
        return jsonlib.loads(self.content)

    def iter_content(self, size: int):
        for start in range(0, len(self.content), size):
            yield self.content[start : start + size]


class DjangoSession:
    def __init__(self):
        self.client = Client()
        self.headers: dict[str, str] = {}
        self.calls: list[tuple[str, str]] = []

    def request(
        self, method, url, *, headers=None, timeout=None, json=None, data=None, stream=False
    ):
        parts = urllib.parse.urlsplit(url)
        path = parts.path + (f"?{parts.query}" if parts.query else "")
        merged = {**self.headers, **(headers or {})}
        content_type = merged.pop("Content-Type", "application/octet-stream")
        if json is not None:
            body, content_type = jsonlib.dumps(json).encode(), "application/json"
        elif data is None:
            body = b""
        else:
            body = data if isinstance(data, bytes) else data.read()
        extra = {"HTTP_" + key.upper().replace("-", "_"): value for key, value in merged.items()}
        self.calls.append((method, path))
        return _Response(
            self.client.generic(method, path, data=body, content_type=content_type, **extra)
        )


def agent_api(credential: str) -> AgentApi:
    return AgentApi(BASE, credential, session=DjangoSession())
