"""What a PyTorch user needs, on the real platform (issue 31): `python` in every job; a gang's
launcher variables; every member's log through the API and the client; checkpoints of any bytes
and one directory per rank through preemption and resume; and a real DDP gang over gloo
(examples/pytorch-ddp, where torch is installed) preempted and resumed from its checkpoints."""

import os
import re
import subprocess
import sys

import pytest

from tests.e2e.platform import ROOT
from tests.e2e.test_own_code import tar_gz, upload

pytestmark = pytest.mark.e2e
GANG = {"gpu_sku": "A100-40GB", "gpus": 1, "nodes": 2}  # one member on each A100 node

SAVER = r"""
import os, sys, time
import gpuplatform_job as job
job.install_checkpoint_handler()
rank = int(os.environ["RANK"])
names = ("RANK", "NODE_RANK", "NNODES", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "WORLD_SIZE")
print("env " + " ".join(f"{n}={os.environ.get(n)}" for n in names), flush=True)
start = 0
if rank == 0 and job.resume_path() is not None:  # rank 0: any bytes
    data = job.resume_path().read_bytes()
    assert data[:4] == b"\x00\xffPT", data[:8]
    start = int(data[4:])
elif rank == 1 and job.resume_dir() is not None:  # rank 1: a directory
    tree = job.resume_dir()
    assert (tree / "shard" / "weights.bin").read_bytes() == b"\x01\x00" * 500
    start = int((tree / "step.txt").read_text())
print(f"rank {rank} starts at step {start}", flush=True)
step = start
while True:
    step += 1
    time.sleep(0.1)
    if rank == 0:
        with job.checkpoint_file("model.bin") as handle:
            handle.write(b"\x00\xffPT" + str(step).encode())
        job.report_progress(min(1.0, step / 1000), step=step)
    else:
        with job.checkpoint_directory() as tree:
            (tree / "shard").mkdir()
            (tree / "shard" / "weights.bin").write_bytes(b"\x01\x00" * 500)
            (tree / "step.txt").write_text(str(step))
    if job.stop_requested():
        print(f"rank {rank} checkpointed at step {step}", flush=True)
        sys.exit(0)
    if start and step >= start + 5:
        print(f"rank {rank} done at step {step}", flush=True)
        sys.exit(0)
"""


def log(platform, job_id: str, **query) -> str:
    response = platform.get(
        "bob", f"/api/v1/jobs/{job_id}/logs/?" + "&".join(f"{k}={v}" for k, v in query.items())
    )
    assert response.status_code == 200, response.text
    return response.text


def preempt(platform, job_id: str) -> None:
    """As the admin's "Preempt selected jobs now" does (apps/jobs/admin.py)."""
    platform.manage("shell", "-c", "from apps.jobs import services; from apps.jobs.models import Job; "
                    f"services.job_preempt(job=Job.objects.get(pk='{job_id}'), actor='test', reason='test')")  # fmt: skip


def cli(platform, *args) -> subprocess.CompletedProcess:
    env = dict(os.environ, GPUPLATFORM_URL=platform.url, GPUPLATFORM_TOKEN=platform.tokens["bob"])
    return subprocess.run([sys.executable, "-m", "gpuplatform.cli", *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=120)  # fmt: skip


def test_python_runs_a_python_3_in_a_job_without_requirements(platform):
    job = platform.submit("bob", command=["python", "-c", "import sys; print('python', sys.version_info[0])"],
                          gpus=1, gpu_sku="H100-80GB")  # fmt: skip
    done = platform.wait_for_state(job["id"], ["succeeded", "failed"], timeout=60)
    assert done["state"] == "succeeded", done["reason"]
    assert "python 3" in log(platform, job["id"])


def test_a_gang_keeps_each_ranks_bytes_or_directory_through_preemption(platform):
    digest = upload(platform, "bob", tar_gz({"saver.py": SAVER.encode()}))
    job = platform.submit("bob", command=["python", "saver.py"], bundle=digest, **GANG)
    platform.wait_for_state(job["id"], "running", timeout=60)
    platform.wait_until(lambda: "rank 1 starts at step 0" in log(platform, job["id"], rank=1, attempt=1),
                        timeout=60, what="rank 1 to start")  # fmt: skip
    first = log(platform, job["id"], rank=1, attempt=1)
    assert "env RANK=1 NODE_RANK=1 NNODES=2 LOCAL_RANK=0 LOCAL_WORLD_SIZE=1 WORLD_SIZE=2" in first
    platform.wait_until(lambda: platform.job(job["id"])["progress"] >= 0.005, timeout=60,
                        what="a few steps, each checkpointed")  # fmt: skip
    preempt(platform, job["id"])
    done = platform.wait_for_state(job["id"], ["succeeded", "failed"], timeout=120)
    assert done["state"] == "succeeded", done["reason"]
    assert [a["state"] for a in done["attempts"]] == ["preempted", "succeeded"]

    saved = {}
    for rank in (0, 1):
        before = log(platform, job["id"], rank=rank, attempt=1)
        saved[rank] = int(re.search(rf"rank {rank} checkpointed at step (\d+)", before).group(1))
        after = log(platform, job["id"], rank=rank, attempt=2)
        assert f"rank {rank} starts at step {saved[rank]}\n" in after, after  # its own, not 0
        assert f"rank {rank} done at step {saved[rank] + 5}" in after
    # The client shows the same member's log of one attempt, or all of them with their lines.
    shown = cli(platform, "logs", job["id"], "--rank", "1", "--attempt", "2")
    assert shown.returncode == 0, shown.stderr
    assert shown.stdout == log(platform, job["id"], rank=1, attempt=2)
    every = cli(platform, "logs", job["id"], "--rank", "1").stdout
    assert every.startswith("=== attempt 1 ===\n") and every.count("env RANK=1 NODE_RANK=1") == 2
    assert (
        every.index("rank 1 checkpointed")
        < every.index("=== attempt 2 ===")
        < every.index("rank 1 done")
    )
    assert platform.get("bob", f"/api/v1/jobs/{job['id']}/logs/?rank=2").status_code == 404


def test_a_ddp_gang_over_gloo_is_preempted_and_resumes_from_its_checkpoints(platform):
    """examples/pytorch-ddp as a user submits it: its own code, `{python}` (the agents' Python,
    which has torch here), a directory checkpoint per rank (`--sharded`)."""
    pytest.importorskip(
        "torch", reason="torch is not installed (pip install torch): no real DDP run"
    )
    example = ROOT / "examples" / "pytorch-ddp"
    digest = upload(platform, "bob", tar_gz({"train.py": (example / "train.py").read_bytes()}))
    argv = [
        "{python}",
        "train.py",
        "--steps",
        "400",
        "--every",
        "5",
        "--step-seconds",
        "0.05",
        "--sharded",
    ]
    job = platform.submit("bob", command=argv, bundle=digest, **GANG)
    platform.wait_for_state(job["id"], "running", timeout=60)
    platform.wait_until(lambda: platform.job(job["id"])["progress"] >= 0.05, timeout=120,
                        what="the gang to train a few steps")  # fmt: skip
    preempt(platform, job["id"])
    done = platform.wait_for_state(job["id"], ["succeeded", "failed"], timeout=240)
    assert done["state"] == "succeeded", done["reason"] + log(platform, job["id"], rank=1)
    assert [a["state"] for a in done["attempts"]] == ["preempted", "succeeded"]
    results = [platform.get("bob", f"/api/v1/jobs/{job['id']}/artifacts/{name}").json()
               for name in ("result.json", "rank-1/result.json")]  # fmt: skip
    assert [(r["rank"], r["world_size"]) for r in results] == [(0, 2), (1, 2)]
    resumed = [r["resumed_from_step"] for r in results]
    assert resumed[0] > 0 and resumed[0] == resumed[1]  # both ranks stopped at the same step
    assert results[0]["weights"] == results[1]["weights"]  # still one model across the gang
    for rank in (0, 1):
        assert f"rank {rank}: checkpointed at step {resumed[0]}" in log(
            platform, job["id"], rank=rank, attempt=1
        )
