"""The agent's HTTP session (workers/agent_client.py `environment_read_once`): what requests would
look up in the environment on every call (proxies, CA bundle) is read once, when the agent starts,
with the same outcome; a call then reads no environment."""

from __future__ import annotations

import http.server
import json
import threading

import pytest
import requests

from workers.agent_client import AgentApi, environment_read_once

BASE = "http://agent-api.example:8000"


@pytest.fixture
def clean_env(monkeypatch):
    for name in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "NO_PROXY", "REQUESTS_CA_BUNDLE",
                 "CURL_CA_BUNDLE", "http_proxy", "https_proxy", "all_proxy", "no_proxy"):  # fmt: skip
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


def test_the_default_session_trusts_no_environment_per_call_but_took_its_settings_once(clean_env):
    clean_env.setenv("HTTP_PROXY", "http://proxy.example:3128")
    clean_env.setenv("HTTPS_PROXY", "http://proxy.example:3129")
    clean_env.setenv("REQUESTS_CA_BUNDLE", "/etc/ssl/our-ca.pem")
    api = AgentApi(BASE, "gpn_x.y")
    assert api.session.trust_env is False
    # What requests' own per-call look-up would have given for the web's URL.
    assert api.session.proxies == requests.utils.get_environ_proxies(BASE + "/internal/agent/v1/")
    assert api.session.proxies["http"] == "http://proxy.example:3128"
    assert api.session.verify == "/etc/ssl/our-ca.pem"


def test_no_proxy_for_the_web_s_host_is_honoured(clean_env):
    clean_env.setenv("HTTP_PROXY", "http://proxy.example:3128")
    clean_env.setenv("NO_PROXY", "agent-api.example")
    assert environment_read_once(BASE).proxies == {}


def test_curl_s_bundle_is_the_fallback_and_none_means_verify(clean_env):
    assert environment_read_once(BASE).verify is True
    clean_env.setenv("CURL_CA_BUNDLE", "/etc/ssl/curl.pem")
    assert environment_read_once(BASE).verify == "/etc/ssl/curl.pem"


class _Web(http.server.BaseHTTPRequestHandler):
    """Answers every POST as the report endpoint does; records the request line and headers."""

    protocol_version = "HTTP/1.1"
    seen: list[tuple[str, str]] = []

    def do_POST(self):  # noqa: N802 (http.server's name)
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        _Web.seen.append((self.requestline, self.headers.get("Authorization", "")))
        body = json.dumps({"results": [{"status": 200, "accepted": True}]}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


@pytest.fixture
def web():
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Web)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    _Web.seen.clear()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def test_a_proxy_set_at_start_is_used_and_the_environment_is_not_read_again(clean_env, web):
    # The "proxy" is the test server itself: a proxied request names the whole URL.
    clean_env.setenv("HTTP_PROXY", web)
    api = AgentApi("http://agent-api.example:8000", "gpn_x.y")
    clean_env.delenv("HTTP_PROXY")
    clean_env.setenv("NETRC", "/nonexistent")
    assert api.reports([{"attempt_id": 1, "rank": 0, "token": "t", "kind": "started", "pid": 1}])
    line, authorization = _Web.seen[-1]
    assert line == "POST http://agent-api.example:8000/internal/agent/v1/reports/ HTTP/1.1"
    assert authorization == "Bearer gpn_x.y"


def test_a_direct_call_keeps_the_node_credential(clean_env, web, tmp_path):
    # A .netrc entry for the web's host no longer replaces the node credential (requests, trusting
    # the environment, would have sent the .netrc's Basic credentials instead).
    netrc = tmp_path / ".netrc"
    netrc.write_text("machine 127.0.0.1 login someone password secret\n")
    netrc.chmod(0o600)
    clean_env.setenv("NETRC", str(netrc))
    api = AgentApi(web, "gpn_x.y")
    api.reports([{"attempt_id": 1, "rank": 0, "token": "t", "kind": "started", "pid": 1}])
    line, authorization = _Web.seen[-1]
    assert line == "POST /internal/agent/v1/reports/ HTTP/1.1"
    assert authorization == "Bearer gpn_x.y"
