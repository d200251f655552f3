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
