"""Interactive sessions end to end (docs/interactive.md): the web (its relay), the dispatcher, root
agents that fence jobs, and the `gpuplatform` client, under a real PTY where a person would have
one. Skipped where the agents cannot fence jobs (not root, no cgroups)."""

from __future__ import annotations

import hashlib
import os
import re
import signal
import subprocess
import sys
import time
import urllib.request

import pytest

from tests.e2e.platform import ROOT, Platform, free_port
from tests.e2e.terminal import CLIENT, Terminal

pytestmark = pytest.mark.timeout(600)

NODES = {"i-n1": ("H100-80GB", 4, "host=n1"), "i-n2": ("H100-80GB", 2, "host=n2")}
ON_N1 = {"host": "n1"}
PROMPT = "READY> "


@pytest.fixture(scope="module")
def platform(tmp_path_factory):
    platform = Platform(
        tmp_path_factory.mktemp("interactive"), name="gpuplatform_e2e_interactive", redis_db=5
    )
    try:
        platform.start(NODES)
        unfenced = [n for n, node in platform.nodes().items() if node["isolation"] == "none"]
        if unfenced:
            pytest.skip(f"these agents cannot fence jobs (isolation none: {unfenced}); the sessions' "
                        "fence needs root and cgroups")  # fmt: skip
        yield platform
    finally:
        platform.stop()


def client_env(platform: Platform, user: str, **extra) -> dict[str, str]:
    env = dict(os.environ, GPUPLATFORM_URL=platform.url, GPUPLATFORM_TOKEN=platform.tokens[user],
               PYTHONPATH=str(ROOT / "client"), TERM="xterm", PS1=PROMPT, **extra)  # fmt: skip
    env.pop("GPUPLATFORM_CONFIG", None)
    return env


def gp(
    platform: Platform, user: str, *args: str, timeout: float = 120, **kwargs
) -> subprocess.CompletedProcess:
    """The client without a terminal (stdin not a TTY)."""
    return subprocess.run([*CLIENT, *args], env=client_env(platform, user), stdin=subprocess.DEVNULL,
                          capture_output=True, text=True, timeout=timeout, **kwargs)  # fmt: skip


def running_job(platform: Platform, user: str = "alice", **body) -> dict:
    body.setdefault("command", ["sleep", "600"])
    body.setdefault("gpus", 1)
    job = platform.submit(user, **body)
    return platform.wait_for_state(job["id"], "running", timeout=120)


def cancel(platform: Platform, job_id: str) -> None:
    platform.post("alice", f"/api/v1/jobs/{job_id}/cancel/")


def events(platform: Platform, job_id: str) -> list[dict]:
    answer = platform.get("staff", f"/api/v1/jobs/{job_id}/")
    assert answer.status_code == 200
    from_db = platform.manage("shell", "-c", (
        "import json; from apps.jobs.models import JobEvent; "
        f"print(json.dumps(list(JobEvent.objects.filter(job_id='{job_id}', kind='session')"
        ".values('actor', 'reason', 'data'))))"))  # fmt: skip
    import json

    return json.loads(from_db.strip().splitlines()[-1])


# --- exec -----------------------------------------------------------------------------------------


def test_exec_runs_inside_the_jobs_fence_and_passes_its_exit_status_through(platform):
    job = running_job(platform, node_selector=ON_N1)
    script = ("echo uid=$(id -u); echo job=$GPUPLATFORM_JOB_ID; echo gpus=$CUDA_VISIBLE_DEVICES; "
              "grep -c . /proc/self/cgroup >/dev/null; cat /proc/self/cgroup | tail -1; "
              "readlink /proc/self/ns/mnt; exit 7")  # fmt: skip
    done = gp(platform, "alice", "exec", job["id"], "--", "sh", "-c", script)
    assert done.returncode == 7, done.stdout + done.stderr
    out = done.stdout
    uid = int(re.search(r"uid=(\d+)", out).group(1))
    assert uid >= 1000, out  # the job's own uid, never root nor the agent's
    assert f"job={job['id']}" in out
    assert re.search(r"gpus=\d", out)
    assert re.search(r"/gpuplatform/i-n1/\w+\.\d+-0$", out, re.M), out  # the job's own cgroup
    # The job's mount namespace, not the agent's.
    namespaces = re.findall(r"mnt:\[\d+\]", out)
    agent_ns = os.readlink("/proc/self/ns/mnt")
    assert namespaces and namespaces[0] != agent_ns, out
    started = [e for e in events(platform, job["id"]) if e["data"].get("event") == "start"]
    assert started and started[0]["actor"] == "alice" and started[0]["data"]["kind"] == "exec"
    cancel(platform, job["id"])


def test_exec_by_rank_in_a_two_node_gang(platform):
    job = running_job(platform, nodes=2, gpus=1)
    for rank in (0, 1):
        done = gp(platform, "alice", "exec", job["id"], "--rank", str(rank), "--",
                  "sh", "-c", f"echo rank=$RANK node=$GPUPLATFORM_NODE; exit {10 + rank}")  # fmt: skip
        assert done.returncode == 10 + rank, done.stdout + done.stderr
        assert f"rank={rank}" in done.stdout
    nodes = {p["node"] for p in job["attempts"][0]["placements"]}
    assert len(nodes) == 2
    missing = gp(platform, "alice", "exec", job["id"], "--rank", "5", "--", "true")
    assert missing.returncode != 0 and "rank" in missing.stderr
    cancel(platform, job["id"])


def test_another_tenant_gets_404_and_a_viewer_is_refused_for_every_command(platform):
    job = running_job(platform, node_selector=ON_N1)
    for args in (
        ["exec", job["id"], "--", "true"],
        ["shell", job["id"]],
        ["port-forward", job["id"], "8000"],
    ):
        outsider = gp(platform, "dave", *args, timeout=60)
        assert outsider.returncode != 0 and "404" in outsider.stderr, (args, outsider.stderr)
        viewer = gp(platform, "carol", *args, timeout=60)
        assert viewer.returncode != 0 and "403" in viewer.stderr, (args, viewer.stderr)
    staff = gp(platform, "staff", "exec", job["id"], "--", "true")
    assert staff.returncode != 0 and "GPUPLATFORM_STAFF_CAN_ATTACH" in staff.stderr
    ended = gp(platform, "alice", "exec", "00000000-0000-0000-0000-000000000000", "--", "true")
    assert ended.returncode != 0 and "404" in ended.stderr
    cancel(platform, job["id"])
    platform.wait_for_state(job["id"], "cancelled")
    over = gp(platform, "alice", "exec", job["id"], "--", "true")
    assert over.returncode != 0 and "409" in over.stderr and "cancelled" in over.stderr
