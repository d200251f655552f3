"""Gangs run as one: both members start with the rendezvous env, a lost member ends the whole
attempt and stops the other, and the retry runs the gang again, through real processes."""

import re

import pytest

from tests.e2e.test_foundation import _gpus_free
from tests.processes import alive

pytestmark = pytest.mark.e2e
GANG = {"template": "demo-train", "gpu_sku": "A100-40GB", "gpus": 2, "nodes": 2}  # both A100 nodes


def member_log(platform, job_id: str, attempt: int, rank: int) -> str:
    for node in platform.agents:  # each agent has its own data dir, as on its own machine
        path = (
            platform.agent_dir(node) / "logs" / job_id / f"attempt-{attempt}-rank-{rank}.log"
        )  # the agent's copy
        if path.exists():
            return path.read_text()
    return ""


def gang_env(platform, job_id: str, attempt: int, rank: int) -> dict[str, str]:
    """What the member printed on its first line: RANK, LOCAL_RANK, WORLD_SIZE, MASTER_*, pid."""
    first = member_log(platform, job_id, attempt, rank).partition("\n")[0]
    return dict(re.findall(r"(\w+)=(\S*)", first))


def test_a_gang_starts_both_members_with_the_rendezvous_env_and_a_lost_member_ends_and_retries_it(
    platform,
):
    job = platform.submit("bob", **GANG, params={"steps": 80, "step_seconds": 0.1})
    running = platform.wait_for_state(job["id"], "running")
    placements = sorted(running["attempts"][0]["placements"], key=lambda p: p["rank"])
    assert sorted(p["node"] for p in placements) == ["e2e-a1", "e2e-a2"]
    platform.wait_until(lambda: all(gang_env(platform, job["id"], 1, r).get("pid") for r in (0, 1)), timeout=30,
                        what="both members to print their env")  # fmt: skip
    envs = [gang_env(platform, job["id"], 1, rank) for rank in (0, 1)]
    assert [(e["RANK"], e["LOCAL_RANK"], e["WORLD_SIZE"]) for e in envs] == [
        ("0", "0", "2"),
        ("1", "0", "2"),
    ]
    assert envs[0]["MASTER_ADDR"] and envs[0]["MASTER_ADDR"] == envs[1]["MASTER_ADDR"]
    assert int(envs[0]["MASTER_PORT"]) > 0 and envs[0]["MASTER_PORT"] == envs[1]["MASTER_PORT"]
    pids = [int(e["pid"]) for e in envs]
    assert all(alive(pid) for pid in pids)

    # The agent of rank 1 dies: its member dies with it, and the platform stops rank 0.
    lost_node, other_node = placements[1]["node"], placements[0]["node"]
    platform.kill(f"agent-{lost_node}")
    platform.wait_until(
        lambda: not any(alive(pid) for pid in pids), timeout=30, what="both members to stop"
    )
    platform.wait_until(
        lambda: _gpus_free(platform, other_node), timeout=30, what=f"{other_node}'s GPUs released"
    )
    waiting = platform.job(job["id"])
    assert waiting["state"] == "queued"  # one A100 node is not enough for the gang: it waits whole
    assert waiting["attempts"][0]["state"] == "lost"
    assert (
        f"node {lost_node} lost" in waiting["reason"]
        or f"agent on {lost_node}" in waiting["reason"]
    )
    assert "retry 1 of" in waiting["reason"]

    platform.restart_agent(lost_node)
    done = platform.wait_for_state(job["id"], "succeeded", timeout=120)
    assert [a["state"] for a in done["attempts"]] == ["lost", "succeeded"]
    assert sorted(p["node"] for p in done["attempts"][1]["placements"]) == ["e2e-a1", "e2e-a2"]
    second = [gang_env(platform, job["id"], 2, rank) for rank in (0, 1)]
    assert [e["RANK"] for e in second] == ["0", "1"] and second[0]["MASTER_PORT"] == second[1][
        "MASTER_PORT"
    ]
    results = [platform.get("bob", f"/api/v1/jobs/{job['id']}/artifacts/{name}").json()
               for name in ("result.json", "rank-1/result.json")]  # fmt: skip
    assert [(r["rank"], r["world_size"]) for r in results] == [(0, 2), (1, 2)]
    assert results[0]["resumed_from_step"] > 0  # the gang resumed from its checkpoint
    platform.wait_until(platform.ready, timeout=60, what="every node ready again")


def test_a_gang_member_that_fails_stops_the_other_and_fails_the_job(platform):
    # Rank 1 runs a command that fails at once; rank 0 would run for a minute.
    code = "import os, sys, time; sys.exit(5) if os.environ['RANK'] == '1' else time.sleep(60)"
    job = platform.submit(
        "bob", command=["python3", "-c", code], gpu_sku="A100-40GB", gpus=2, nodes=2
    )
    done = platform.wait_for_state(job["id"], ["failed", "succeeded"], timeout=60)
    assert (done["state"], done["exit_code"]) == ("failed", 5)
    assert [a["state"] for a in done["attempts"]] == ["failed"]
    platform.wait_until(lambda: _gpus_free(platform, "e2e-a1") and _gpus_free(platform, "e2e-a2"), timeout=30,
                        what="rank 0 stopped and every GPU of the gang released")  # fmt: skip
