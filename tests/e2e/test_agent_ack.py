"""A start message taken by an agent that is SIGKILLed before it launches the member: nothing is
lost. The agent keeps no copy of a taken message in Redis (workers/celery_app.py
`NO_ACK_EMULATION`), so the message dies with it; the database brings the job back: the node is
lost after `NODE_LOST_AFTER` x `HEARTBEAT` of silence, or the node's next agent registers sooner,
and either ends the attempt `lost` and queues the job again (docs/reliability.md).

"Before it launches" is made certain by stopping (SIGSTOP) the agent's fork server first: the
agent takes the message, the launch waits on the fork server, the job cannot start."""

import re
import signal
import time

import psutil
import pytest
import redis

from apps.platform import broker_keys
from tests.e2e.platform import Platform

pytestmark = pytest.mark.e2e

NODE = "ack-h1"
TRAIN = {
    "template": "demo-train",
    "gpu_sku": "H100-80GB",
    "gpus": 1,
    "params": {"steps": 3, "step_seconds": 0.05},
}


@pytest.fixture(scope="module")
def platform(tmp_path_factory):
    platform = Platform(
        tmp_path_factory.mktemp("agent-ack"), name="gpuplatform_e2e_agent_ack", own_redis=True
    )
    try:
        platform.start({NODE: ("H100-80GB", 1, "")})
        if platform.nodes()[NODE].get("isolation", "none") == "none":
            pytest.skip(
                "the test agent does not fence jobs here (not root, no cgroups): no fork server to hold"
            )
        yield platform
    finally:
        platform.stop()


def fork_server(platform) -> psutil.Process:
    agent = psutil.Process(platform.processes[f"agent-{NODE}"].pid)
    return next(p for p in agent.children() if any("forkserver" in part for part in p.cmdline()))


def agent_log(platform) -> str:
    return platform.logs(f"agent-{NODE}", tail=10**7)


def starts_received(platform) -> int:
    return len(re.findall(r"Task workers\.start_attempts?\[\S+\] received", agent_log(platform)))


def take_a_start_and_die(platform) -> tuple[str, float]:
    """Submit a job; once the agent has taken its start message (held in a launch that waits on
    the stopped fork server), SIGKILL the agent. Returns the job's id and when it was killed."""
    platform.wait_until(
        lambda: platform.nodes()[NODE]["state"] == "ready", timeout=60, what="node ready"
    )
    warm = platform.submit("bob", **TRAIN)  # the fork server starts at the agent's first launch
    assert (
        platform.wait_for_state(warm["id"], ["succeeded", "failed"], timeout=60)["state"]
        == "succeeded"
    )
    broker = redis.Redis.from_url(platform.env["REDIS_URL"])
    queue = broker_keys.node_queue(NODE)
    unacked = broker_keys.unacked_options(NODE)
    fork_server(platform).send_signal(signal.SIGSTOP)
    launches, received = agent_log(platform).count("started attempt "), starts_received(platform)
    job = platform.submit("bob", **TRAIN)

    def taken() -> bool:
        return starts_received(platform) > received and broker.llen(queue) == 0

    platform.wait_until(taken, timeout=30, what="the agent took the start message")
    time.sleep(0.3)  # well into the launch, which waits on the fork server
    taken_job = platform.job(job["id"])
    assert (
        taken_job["state"] == "starting" and taken_job["attempts"][0]["started_at"] is None
    )  # not launched
    # Nowhere in Redis: not in the queue, not in the node's unacked hash or index.
    assert broker.llen(queue) == 0
    assert broker.hlen(unacked["unacked_key"]) == 0
    assert broker.zcard(unacked["unacked_index_key"]) == 0
    platform.kill(f"agent-{NODE}")  # SIGKILL; the stopped fork server dies with it
    assert agent_log(platform).count("started attempt ") == launches
    return job["id"], time.monotonic()


def test_a_start_taken_by_an_agent_killed_before_the_launch_is_requeued_when_its_node_is_lost(
    platform,
):
    job_id, killed_at = take_a_start_and_die(platform)
    platform.wait_until(
        lambda: platform.nodes()[NODE]["state"] == "lost",
        timeout=30,
        what="node lost",
        interval=0.05,
    )
    platform.wait_until(lambda: platform.job(job_id)["state"] == "queued", timeout=30, what="job queued again",
                        interval=0.05)  # fmt: skip
    requeued_after = time.monotonic() - killed_at
    heartbeat = float(platform.env["GPUPLATFORM_HEARTBEAT_SECONDS"])
    tick = float(platform.env["GPUPLATFORM_RECONCILE_TICK_SECONDS"])
    assert requeued_after <= 3 * heartbeat + 2 * tick + 2.0, (
        requeued_after
    )  # + slack for a busy machine
    assert [a["state"] for a in platform.job(job_id)["attempts"]] == ["lost"]

    platform.restart_agent(NODE)
    done = platform.wait_for_state(job_id, ["succeeded", "failed"], timeout=90)
    assert done["state"] == "succeeded"
    assert [a["state"] for a in done["attempts"]] == ["lost", "succeeded"]


def test_a_start_taken_by_an_agent_killed_before_the_launch_runs_once_its_next_agent_registers(
    platform,
):
    job_id, killed_at = take_a_start_and_die(platform)
    platform.restart_agent(NODE)  # at once, as systemd's Restart= would
    done = platform.wait_for_state(job_id, ["succeeded", "failed"], timeout=90)
    # The register ends the attempt at once; then its backoff and a start.
    ran_after = time.monotonic() - killed_at
    assert done["state"] == "succeeded"
    assert [a["state"] for a in done["attempts"]] == ["lost", "succeeded"]
    assert ran_after <= 30, ran_after
