"""A GPU job goes from the API to a GPU node and back, through real processes."""

import json
import re
import time
from datetime import datetime

import pytest

from tests.processes import alive, group_cmdlines

pytestmark = pytest.mark.e2e
TRAIN = {"template": "demo-train", "gpu_sku": "H100-80GB"}


def test_a_demo_train_job_runs_and_its_results_come_back(platform):
    job = platform.submit("bob", **TRAIN, gpus=2, params={"steps": 5, "step_seconds": 0.1})
    done = platform.wait_for_state(job["id"], "succeeded")

    assert done["progress"] == 1.0 and done["exit_code"] == 0
    [attempt] = done["attempts"]
    [placement] = attempt["placements"]
    assert placement["node"] == "e2e-h1" and len(placement["gpu_indices"]) == 2

    log = platform.get("bob", f"/api/v1/jobs/{job['id']}/logs/").text
    assert "step 5/5" in log
    artifacts = platform.get("bob", f"/api/v1/jobs/{job['id']}/artifacts/").json()
    assert [a["name"] for a in artifacts] == ["result.json"]
    result = platform.get("bob", f"/api/v1/jobs/{job['id']}/artifacts/result.json").json()
    # The GPUs the job saw are exactly the ones its attempt holds.
    assert result["cuda_visible_devices"] == ",".join(map(str, placement["gpu_indices"]))
    assert result["steps"] == 5


def test_no_platform_process_carries_a_secret_on_its_command_line(platform):
    """`ps` shows every command line to every user: the web, its workers, the dispatcher and its
    beat, the agents get their secrets through the environment or files only."""
    import urllib.parse

    secrets = {platform.env["SECRET_KEY"]}
    for name in ("REDIS_URL", "DATABASE_URL"):
        secrets.add(urllib.parse.urlsplit(platform.env[name]).password)
    secrets |= {
        value
        for key, value in platform.env.items()
        if re.search("CREDENTIAL|TOKEN|PASSWORD|BASIC_AUTH", key)
    }
    secrets = {secret for secret in secrets if secret and len(secret) >= 8}
    assert (
        urllib.parse.urlsplit(platform.env["REDIS_URL"]).password in secrets
    )  # the run's Redis has one
    seen = {}
    for process in platform.processes.values():
        if process.poll() is None:
            seen.update(group_cmdlines(process.pid))
    assert len(seen) >= len(platform.processes)
    for pid, cmdline in seen.items():
        for secret in secrets:
            assert secret.encode() not in cmdline, f"pid {pid}: {cmdline!r} carries a secret"


def test_jobs_that_need_more_than_a_node_never_share_a_gpu(platform):
    # 5 jobs x 2 GPUs on a 4-GPU node: at most two at a time, never the same GPU twice at once.
    ids = [
        platform.submit("bob", **TRAIN, gpus=2, params={"steps": 4, "step_seconds": 0.15})["id"]
        for _ in range(5)
    ]
    jobs = [platform.wait_for_state(i, "succeeded") for i in ids]
    holds = []
    for job in jobs:
        [attempt] = job["attempts"]
        start, end = _ts(attempt["placed_at"]), _ts(attempt["ended_at"])
        holds += [(gpu, start, end, job["id"]) for gpu in attempt["placements"][0]["gpu_indices"]]
    for gpu, start, end, owner in holds:
        for other_gpu, other_start, other_end, other in holds:
            if other != owner and other_gpu == gpu:
                assert end <= other_start or other_end <= start, (
                    f"GPU {gpu} shared by {owner} and {other}"
                )
    assert max(len({h[3] for h in holds if h[1] <= t < h[2]}) for t in {h[1] for h in holds}) <= 2


def test_a_failing_job_ends_failed_with_its_exit_code(platform):
    job = platform.submit(
        "bob", **TRAIN, gpus=1, params={"steps": 5, "fail_at_step": 2, "step_seconds": 0.05}
    )
    done = platform.wait_for_state(job["id"], ["failed", "succeeded"])
    assert done["state"] == "failed"
    assert done["exit_code"] == 3
    assert done["attempts"][0]["exit_code"] == 3
    assert len(done["attempts"]) == 1  # a user error is not retried


def test_a_failing_command_ends_failed_with_its_exit_code(platform):
    job = platform.submit(
        "bob", command=["python3", "-c", "import sys; sys.exit(7)"], gpus=1, gpu_sku="H100-80GB"
    )
    done = platform.wait_for_state(job["id"], ["failed", "succeeded"])
    assert (done["state"], done["exit_code"]) == ("failed", 7)


def test_a_job_past_its_max_runtime_is_killed_with_reason_timeout(platform):
    job = platform.submit(
        "bob", command=["sleep", "60"], gpus=1, gpu_sku="H100-80GB", max_runtime_seconds=1
    )
    done = platform.wait_for_state(job["id"], ["failed", "succeeded"], timeout=60)
    assert done["state"] == "failed"
    assert done["reason"] == "timeout"
    assert done["attempts"][0]["reason"] == "timeout"


def test_cancelling_a_running_job_kills_its_whole_process_tree(platform):
    code = "import subprocess, time; c = subprocess.Popen(['sleep', '300']); print('child', c.pid, flush=True); time.sleep(300)"
    job = platform.submit("bob", command=["python3", "-c", code], gpus=1, gpu_sku="H100-80GB")
    platform.wait_for_state(job["id"], "running")
    pids = []

    def child_reported():
        pids[:] = re.findall(
            r"child (\d+)", platform.get("bob", f"/api/v1/jobs/{job['id']}/logs/").text
        )
        return bool(pids)

    platform.wait_until(child_reported, timeout=30, what="the job to print its child's pid")
    child = int(pids[0])
    assert alive(child)

    response = platform.post("bob", f"/api/v1/jobs/{job['id']}/cancel/")
    assert response.status_code == 200 and response.json()["state"] == "cancelled"
    platform.wait_until(lambda: not alive(child), timeout=20, what=f"child {child} to die")
    platform.wait_until(
        lambda: _gpus_free(platform, "e2e-h1"), timeout=20, what="the job's GPU to be released"
    )
    assert platform.job(job["id"])["attempts"][0]["state"] == "cancelled"


def test_a_killed_agent_loses_its_node_and_the_job_succeeds_once_elsewhere(platform):
    job = platform.submit("bob", template="demo-train", gpu_sku="A100-40GB", gpus=2,
                          params={"steps": 40, "step_seconds": 0.1})  # fmt: skip
    running = platform.wait_for_state(job["id"], "running")
    first_node = running["attempts"][0]["placements"][0]["node"]
    platform.wait_until(
        lambda: platform.job(job["id"])["progress"] > 0.1, timeout=30, what="some progress"
    )

    platform.kill(f"agent-{first_node}")
    killed_at = time.monotonic()
    platform.wait_until(lambda: platform.nodes()[first_node]["state"] == "lost", timeout=30, what=f"{first_node} lost",
                        interval=0.05)  # fmt: skip
    heartbeat = float(platform.env["GPUPLATFORM_HEARTBEAT_SECONDS"])
    tick = float(platform.env["GPUPLATFORM_RECONCILE_TICK_SECONDS"])
    # Lost after three silent heartbeat intervals, seen on the next reconcile tick (+ slack for a busy CI).
    assert time.monotonic() - killed_at <= 3 * heartbeat + 2 * tick + 2.0

    done = platform.wait_for_state(job["id"], "succeeded", timeout=120)
    states = [a["state"] for a in done["attempts"]]
    assert states == ["lost", "succeeded"]
    assert done["attempts"][1]["placements"][0]["node"] != first_node
    # It resumed from its checkpoint rather than starting over.
    result = platform.get("bob", f"/api/v1/jobs/{job['id']}/artifacts/result.json").json()
    assert result["resumed_from_step"] > 0

    platform.restart_agent(first_node)
    platform.wait_until(
        lambda: platform.nodes()[first_node]["state"] == "ready", timeout=60, what="node back"
    )


def _gpus_free(platform, node: str) -> bool:
    return all(g["allocated_to"] is None for g in platform.nodes()[node]["gpus"])


def _ts(text: str) -> float:
    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


def test_flower_is_not_in_the_way_of_the_api(platform):
    assert platform.get(None, "/api/v1/jobs/").status_code == 401
    assert json.loads(platform.get(None, "/healthz").text)["ok"] is True
