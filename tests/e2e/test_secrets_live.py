"""Tenant secrets through real processes: gunicorn (with its access log, the platform at
LOG_LEVEL=DEBUG), the dispatcher and a node agent. A value goes in through the API, is answered
only by the agent API's secrets endpoint to the node its job's member runs on, survives a key
rotation drill (new key first and a restart, `rotate_secrets`, old key dropped and a restart),
is gone for that member once deleted (410), and appears in no process's log output.

The rotation is a rolling one, as a deployment does it: a web process with the new keys starts
beside the running one (a restart of the only web would cut the agent's heartbeats, and the
node's running job with them)."""

import sys

import pytest
import requests
from cryptography.fernet import Fernet

from tests.e2e.platform import Platform, free_port

pytestmark = pytest.mark.e2e

VALUE = "live-DISTINCTIVE-value-e2e-0b7f"  # noqa: S105 (a test's value)
OLD, NEW = Fernet.generate_key().decode(), Fernet.generate_key().decode()
NODE = "e2e-s1"


@pytest.fixture(scope="module")
def live(tmp_path_factory):
    platform = Platform(tmp_path_factory.mktemp("secrets-live"), name="gpuplatform_secrets_live", redis_db=11,
                        env={"LOG_LEVEL": "DEBUG", "GPUPLATFORM_SECRET_KEYS": OLD})  # fmt: skip
    platform.start_web = lambda: start_web(platform)  # type: ignore[method-assign]
    try:
        yield platform.start({NODE: ("H100-80GB", 2, "")})
    finally:
        platform.stop()


def start_web(
    platform: Platform, name: str = "web", port: int | None = None, keys: str | None = None
) -> str:
    """The Procfile's web: gunicorn with its access log on (what an operator's logs hold)."""
    port = port or platform.port
    env = dict(platform.env, **({"GPUPLATFORM_SECRET_KEYS": keys} if keys else {}))
    platform.spawn(name, [sys.executable, "-m", "gunicorn", "gpuplatform.asgi:application", "--worker-class",
                          "gpuplatform.web_worker.Worker", f"--bind=127.0.0.1:{port}", "--workers", "1",
                          "--threads", "4", "--timeout", "60", "--access-logfile", "-",
                          "--log-level", "debug"], env=env)  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    platform.wait_until(lambda: _answers(url), timeout=90, what=f"{name} answering")
    return url


def _answers(url: str) -> bool:
    try:
        return requests.get(url + "/healthz", timeout=2).status_code == 200
    except requests.RequestException:
        return False


def agent(platform: Platform) -> requests.Session:
    session = requests.Session()
    session.headers["Authorization"] = (
        f"Bearer {platform.agent_envs[NODE]['GPUPLATFORM_NODE_CREDENTIAL']}"
    )
    return session


def member(platform: Platform, job_id: str) -> dict:
    found: dict = {}

    def placed():
        answer = (
            agent(platform).get(f"{platform.url}/internal/agent/v1/assignments/", timeout=30).json()
        )
        found.update(next((m for m in answer["members"] if m["job_id"] == job_id), {}))
        return bool(found)

    platform.wait_until(placed, timeout=90, what=f"job {job_id} placed on {NODE}")
    return found


def secrets_of(
    platform: Platform, work: dict, token: str | None = None, web: str | None = None
) -> requests.Response:
    url = f"{web or platform.url}/internal/agent/v1/members/{work['attempt_id']}/{work['rank']}/secrets/"
    return agent(platform).get(url, headers={"X-Attempt-Token": token or work["token"]}, timeout=30)


def test_a_secret_reaches_only_its_jobs_node_survives_rotation_and_is_never_logged(live):
    alice = live.api("alice")
    made = alice.post(
        f"{live.url}/api/v1/secrets/", json={"name": "HF_TOKEN", "value": VALUE}, timeout=30
    )
    assert made.status_code == 201 and set(made.json()) == {"name", "created_at", "updated_at"}
    again = alice.post(
        f"{live.url}/api/v1/secrets/", json={"name": "HF_TOKEN", "value": VALUE}, timeout=30
    )
    assert again.status_code == 400 and VALUE not in again.text
    refused = live.api("bob").post(
        f"{live.url}/api/v1/secrets/", json={"name": "B", "value": VALUE}, timeout=30
    )
    assert refused.status_code == 403
    assert (
        live.post(
            "bob", "/api/v1/jobs/", {"template": "demo-train", "secrets": ["NOPE"]}
        ).status_code
        == 400
    )

    job = live.submit(
        "bob",
        template="demo-train",
        params={"steps": 400, "step_seconds": 0.5},
        secrets=["HF_TOKEN"],
    )
    assert job["secrets"] == ["HF_TOKEN"]
    work = member(live, job["id"])
    assert work["secrets"] == ["HF_TOKEN"]  # the assignment: names only
    answer = secrets_of(live, work)
    assert answer.status_code == 200 and answer.json() == {"secrets": {"HF_TOKEN": VALUE}}
    assert answer.headers["Cache-Control"] == "no-store"
    assert secrets_of(live, work, token="00000000-0000-0000-0000-000000000000").status_code == 404

    # rotation: a web with the new key first (the old one still decrypts), rotate, then a web
    # with the old key dropped; the web still on the old key alone can no longer read it
    both = start_web(live, "web-new-old", free_port(), keys=f"{NEW},{OLD}")
    assert secrets_of(live, work, web=both).json() == {"secrets": {"HF_TOKEN": VALUE}}
    live.env["GPUPLATFORM_SECRET_KEYS"] = f"{NEW},{OLD}"  # the command runs with the new settings
    out = live.manage("rotate_secrets")
    assert out.strip() == "rotated 1 secret(s) under the first of 2 key(s)"
    new_only = start_web(live, "web-new", free_port(), keys=NEW)
    assert secrets_of(live, work, web=new_only).json() == {"secrets": {"HF_TOKEN": VALUE}}
    assert secrets_of(live, work, web=both).json() == {"secrets": {"HF_TOKEN": VALUE}}
    stale = secrets_of(live, work)  # the first web: OLD only
    assert (
        stale.status_code == 409
        and "HF_TOKEN" in stale.json()["detail"]
        and VALUE not in stale.text
    )

    assert alice.delete(f"{live.url}/api/v1/secrets/HF_TOKEN/", timeout=30).status_code == 204
    gone = secrets_of(live, work)
    assert gone.status_code == 410 and gone.json()["detail"] == "secret HF_TOKEN no longer exists"
    live.post("bob", f"/api/v1/jobs/{job['id']}/cancel/")

    logs = {path.name: path.read_text(errors="replace") for path in live.data_dir.glob("**/*.log")}
    assert {
        "web.log",
        "web-new-old.log",
        "web-new.log",
        "dispatcher.log",
        f"agent-{NODE}.log",
    } <= set(logs)
    assert "GET /internal/agent/v1/members/" in logs["web.log"]  # the access log is on
    assert "DEBUG" in logs["web.log"] or "[DEBUG]" in logs["web.log"]
    assert [name for name, text in logs.items() if VALUE in text] == []
