"""Nothing but the public endpoints answers without credentials: pages redirect to sign-in,
the API says 401, Flower asks for basic auth."""

import base64
import os
import pathlib
import re
import signal
import socket
import subprocess
import sys
import time

import pytest
import requests
from django.test import Client

from tests.e2e.platform import ROOT

PUBLIC = ["/login/", "/healthz", "/metrics"]


@pytest.mark.parametrize(
    "path", ["/", "/jobs/", "/jobs/new/", "/usage/", "/admin/", "/admin/nodes/node/"]
)
def test_pages_redirect_anonymous_visitors_to_sign_in(db, path):
    response = Client().get(path)
    assert response.status_code == 302 and "/login/" in response["Location"]


@pytest.mark.parametrize("path", ["/api/v1/jobs/", "/api/v1/usage/", "/api/v1/nodes/"])
def test_the_api_answers_401_without_a_token(db, path):
    assert Client().get(path).status_code == 401


def test_public_endpoints_answer_without_credentials(db):
    assert Client().get("/login/").status_code == 200
    assert Client().get("/metrics").status_code == 200
    assert Client().get("/healthz").status_code in (200, 503)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.mark.e2e
def test_flower_asks_for_basic_auth():
    port = _free_port()
    # As the Procfile runs it: the password in Flower's environment (FLOWER_BASIC_AUTH), where
    # `ps` cannot show it, never on its command line.
    env = dict(
        os.environ, FLOWER_UNAUTHENTICATED_API="false", FLOWER_BASIC_AUTH="ops:flower-test-pw"
    )
    flower = subprocess.Popen(
        [sys.executable, "-m", "celery", "-A", "gpuplatform", "flower", f"--port={port}", "--address=127.0.0.1"],
        cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
    )  # fmt: skip
    try:
        url = f"http://127.0.0.1:{port}/"
        deadline = time.monotonic() + 60
        while True:
            try:
                anonymous = requests.get(url, timeout=5)
                break
            except requests.ConnectionError:
                assert time.monotonic() < deadline and flower.poll() is None, "flower did not start"
                time.sleep(0.3)
        assert anonymous.status_code == 401
        assert requests.get(url + "api/workers", timeout=5).status_code == 401
        assert requests.get(url, auth=("ops", "wrong"), timeout=5).status_code == 401
        good = base64.b64encode(b"ops:flower-test-pw").decode()
        assert (
            requests.get(url, headers={"Authorization": f"Basic {good}"}, timeout=10).status_code
            == 200
        )
        cmdline = pathlib.Path(f"/proc/{flower.pid}/cmdline").read_bytes()
        assert b"flower" in cmdline and b"flower-test-pw" not in cmdline
        ps = subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True).stdout
        assert "flower-test-pw" not in ps
    finally:
        os.killpg(flower.pid, signal.SIGTERM)
        flower.wait(15)


def test_no_procfile_command_carries_a_secret():
    """`ps` shows every command line to every user of the machine: secrets go through the
    environment (or a file), never as arguments (a `$VAR` in a Procfile line is expanded into
    the process's arguments)."""
    procfile = (ROOT / "Procfile").read_text()
    secrets = r"FLOWER_BASIC_AUTH|SECRET_KEY|REDIS_URL|DATABASE_URL|GPUPLATFORM_NODE_CREDENTIAL|GPUPLATFORM_AGENT_REDIS_URL"
    assert not re.search(r"\$\{?(" + secrets + r")\b", procfile)
    assert not re.search(
        r"--(broker|basic-auth|password|result-backend|credential)(=|\s)", procfile
    )
