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


def _procfile_command(name: str) -> str:
    [line] = [
        line for line in (ROOT / "Procfile").read_text().splitlines() if line.startswith(f"{name}:")
    ]
    return line.split(":", 1)[1].strip()


def _procfile_env(**extra) -> dict:
    """The environment a Procfile process gets from honcho: the venv's python first on PATH."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLOWER_")}
    env["PATH"] = f"{pathlib.Path(sys.executable).parent}:{env.get('PATH', '')}"
    return dict(env, **extra)


def _first_answer(url: str, process: subprocess.Popen) -> requests.Response:
    deadline = time.monotonic() + 60
    while True:
        try:
            return requests.get(url, timeout=5)
        except requests.ConnectionError:
            assert time.monotonic() < deadline and process.poll() is None, "flower did not start"
            time.sleep(0.3)


@pytest.mark.e2e
def test_the_procfiles_flower_makes_its_own_credentials_under_the_data_dir(tmp_path):
    """Started from the Procfile without FLOWER_BASIC_AUTH (not under `make run`), Flower still
    asks for basic auth: user "admin", the password `make run` keeps in the data dir."""
    port = _free_port()
    env = _procfile_env(FLOWER_PORT=str(port), GPUPLATFORM_DATA_DIR=str(tmp_path))
    flower = subprocess.Popen(
        ["bash", "-c", _procfile_command("flower")], cwd=ROOT, env=env,
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
    )  # fmt: skip
    try:
        url = f"http://127.0.0.1:{port}/"
        assert _first_answer(url, flower).status_code == 401
        assert requests.get(url + "api/workers", timeout=5).status_code == 401
        password = (tmp_path / "flower_password").read_text().strip()
        assert (tmp_path / "flower_password").stat().st_mode & 0o077 == 0
        assert requests.get(url, auth=("admin", password), timeout=10).status_code == 200
        ps = subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True).stdout
        assert password not in ps
    finally:
        os.killpg(flower.pid, signal.SIGTERM)
        flower.wait(15)


@pytest.mark.parametrize("given", ["", "admin", "admin:", ":pw", "ops:pw,admin"])
def test_the_procfiles_flower_refuses_unusable_credentials(tmp_path, given):
    env = _procfile_env(FLOWER_PORT=str(_free_port()), GPUPLATFORM_DATA_DIR=str(tmp_path),
                        FLOWER_BASIC_AUTH=given)  # fmt: skip
    flower = subprocess.Popen(
        ["bash", "-c", _procfile_command("flower")], cwd=ROOT, env=env, stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE, text=True, start_new_session=True,
    )  # fmt: skip
    try:
        _, stderr = flower.communicate(timeout=60)
    finally:
        if flower.poll() is None:  # it started: the test fails below
            os.killpg(flower.pid, signal.SIGTERM)
            flower.wait(15)
    assert flower.returncode != 0
    assert "refusing to start: FLOWER_BASIC_AUTH" in stderr


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
