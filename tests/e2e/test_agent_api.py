"""The platform's own agents, as real processes: they hold only the web's URL and a node
credential, never the database URL, the secret key or the Redis URL, and run jobs through the
agent API (the other e2e tests: logs, progress, checkpoints, artifacts)."""

import pathlib

import pytest

pytestmark = pytest.mark.e2e
SECRETS = ("DATABASE_URL", "SECRET_KEY", "REDIS_URL", "FLOWER_BASIC_AUTH")


def environ(pid: int) -> dict[str, str]:
    raw = pathlib.Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    return dict(item.decode(errors="replace").partition("=")[::2] for item in raw if item)


def test_an_agent_holds_only_the_url_and_its_credential(platform):
    assert platform.agents
    for node in platform.agents:
        env = environ(platform.processes[f"agent-{node}"].pid)
        assert not [name for name in SECRETS if name in env], node
        assert env["GPUPLATFORM_URL"] == platform.url
        assert env["GPUPLATFORM_NODE_CREDENTIAL"].startswith("gpn_")
        assert "gpuplatform.settings" not in env.get("DJANGO_SETTINGS_MODULE", "")


def test_each_node_shows_how_its_agent_isolates_jobs(platform):
    nodes = platform.nodes()
    assert all(
        nodes[name]["isolation"] for name in platform.agents
    )  # "none" where the agent cannot


def test_each_agent_consumes_its_queue_with_its_own_broker_credential(platform):
    platform.wait_until(lambda: all("ready." in platform.logs(f"agent-{n}", 200000) for n in platform.agents),
                        timeout=30, what="every agent's Celery consumer ready")  # fmt: skip
    for node in platform.agents:
        log = platform.logs(f"agent-{node}", 200000)
        assert f"gpuplatform-node-{node}" in log or "Connected to" in log
        assert "no permissions" not in log and "Cannot connect to" not in log, node


def test_forged_start_and_stop_messages_on_the_broker_change_nothing(platform):
    """Whoever can write to a node's queue (here with the platform's own Redis credential) still
    cannot stop a running job or start one: the real agent checks each message with the agent API
    and ignores what the platform did not place there or ask for."""
    from celery import Celery

    from apps.scheduling.queues import START_ATTEMPT_TASK, STOP_ATTEMPT_TASK, node_queue

    job = platform.submit("bob", command=["python3", "-c", "import time; time.sleep(300)"], gpus=1,
                          gpu_sku="H100-80GB", node_selector={"rack": "r1"})  # fmt: skip
    platform.wait_for_state(job["id"], "running")
    out = platform.manage("shell", "-c", "from apps.jobs.models import JobAttempt; "
                          f"a = JobAttempt.objects.get(job_id='{job['id']}'); print('ATTEMPT', a.pk, a.token)")  # fmt: skip
    attempt_id, token = next(
        line for line in out.splitlines() if line.startswith("ATTEMPT ")
    ).split()[1:]
    attempt_id, forged = int(attempt_id), "00000000-0000-0000-0000-000000000000"
    forger = Celery("forger", broker=platform.env["REDIS_URL"], set_as_current=False)
    messages = [
        (
            STOP_ATTEMPT_TASK,
            {"attempt_id": attempt_id, "rank": 0, "token": forged, "why": "cancel"},
        ),
        (STOP_ATTEMPT_TASK, {"attempt_id": attempt_id, "rank": 0, "token": token, "why": "cancel"}),
        (START_ATTEMPT_TASK, {"attempt_id": attempt_id + 100000, "rank": 0, "token": forged}),
    ]
    for task, kwargs in messages:
        forger.send_task(task, kwargs=kwargs, queue=node_queue("e2e-h1"), retry=False)
    ignored = (
        f"message for attempt {attempt_id} rank 0 is not for a member placed here",
        f"stop message for attempt {attempt_id} rank 0, which the platform did not ask to stop",
        f"message for attempt {attempt_id + 100000} rank 0 is not for a member placed here",
    )
    platform.wait_until(lambda: all(line in platform.logs("agent-e2e-h1", 400000) for line in ignored),
                        timeout=30, what="the agent to check and ignore each forged message")  # fmt: skip
    after = platform.job(job["id"])
    assert after["state"] == "running" and after["attempts"][0]["state"] == "running", after
    assert platform.post("bob", f"/api/v1/jobs/{job['id']}/cancel/").status_code == 200
    platform.wait_for_state(job["id"], "cancelled")
