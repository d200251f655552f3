"""On a machine with an NVIDIA GPU (skipped elsewhere, with NVML's answer as the reason): the
whole platform with one agent started without `--fake`. The agent registers what NVML finds
(each GPU's UUID and memory), a one-GPU command job runs real CUDA on the GPU it was given (the
GPU's UUID seen from inside the job is the one the platform allocated, and the node's telemetry
shows its memory taken while it runs), and a job given no GPU cannot open the GPU's device file
nor start CUDA, even when it clears CUDA_VISIBLE_DEVICES itself: the fence, not the
environment, keeps it off (where the agent fences; it says so where it cannot).

How it was run on a GPU machine, and what it printed: docs/operations.md, "A real GPU"."""

from __future__ import annotations

import base64
import json
import sys
import time

import pytest

from tests.e2e.platform import Platform

pytestmark = pytest.mark.e2e
NODE = "gpu-real-1"
SKU = "gpu-real"  # the operator's name for the node's GPUs; its memory is NVML's

CUDA_JOB = r"""
import json, os, time
import torch
assert torch.cuda.is_available(), "no CUDA in the job"
props = torch.cuda.get_device_properties(0)
held = torch.empty(4 << 30, dtype=torch.uint8, device="cuda")  # 4 GiB, seen by NVML
a = torch.randn(4096, 4096, device="cuda")
until = time.monotonic() + float(os.environ.get("HOLD_SECONDS", "6"))
products = 0
while time.monotonic() < until:
    b = a @ a
    torch.cuda.synchronize()
    products += 1
result = {"name": props.name, "uuid": "GPU-" + str(props.uuid), "count": torch.cuda.device_count(),
          "visible": os.environ.get("CUDA_VISIBLE_DEVICES"), "products": products,
          "finite": bool(torch.isfinite(b).all())}
print("cuda ok", json.dumps(result), flush=True)
with open(os.path.join(os.environ["GPUPLATFORM_OUTPUT_DIR"], "result.json"), "w") as f:
    json.dump(result, f)
"""

NO_GPU_JOB = r"""
import json, os
os.environ.pop("CUDA_VISIBLE_DEVICES", None)  # the job tries: the fence must hold anyway
seen = {}
for name in sorted(os.listdir("/dev")):
    if name.startswith("nvidia") and name[6:].isdigit():
        try:
            os.close(os.open("/dev/" + name, os.O_RDWR))
            seen[name] = "opened"
        except OSError as error:
            seen[name] = type(error).__name__
import torch
print("fence", json.dumps({"devices": seen, "cuda": torch.cuda.is_available(),
                           "count": torch.cuda.device_count()}), flush=True)
"""


def python(code: str) -> list[str]:
    """A command running `code` in the agent's interpreter (a command's arguments hold no
    newlines: the code travels base64-encoded)."""
    encoded = base64.b64encode(code.encode()).decode()
    return [sys.executable, "-c", f"import base64; exec(base64.b64decode('{encoded}'))"]


def nvml_inventory() -> tuple[list[dict], str]:
    """The GPUs NVML reports here (index, uuid, memory, name), or [] and why none."""
    try:
        import pynvml

        pynvml.nvmlInit()
    except Exception as error:  # noqa: BLE001 (any failure means: no GPU here)
        return [], f"{type(error).__name__}: {error}"
    try:
        found = []
        for index in range(pynvml.nvmlDeviceGetCount()):
            handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            uuid, name = pynvml.nvmlDeviceGetUUID(handle), pynvml.nvmlDeviceGetName(handle)
            found.append({"index": index, "uuid": uuid.decode() if isinstance(uuid, bytes) else uuid,
                          "name": name.decode() if isinstance(name, bytes) else name,
                          "memory_mib": pynvml.nvmlDeviceGetMemoryInfo(handle).total // 2**20})  # fmt: skip
        return found, "" if found else "NVML reports no GPU"
    finally:
        pynvml.nvmlShutdown()


@pytest.fixture(scope="module")
def gpus():
    found, why = nvml_inventory()
    if not found:
        pytest.skip(f"no NVIDIA GPU here ({why}): this module runs on a GPU machine")
    return found


@pytest.fixture(scope="module")
def platform(gpus, tmp_path_factory):
    # GPUs read every second (workers/telemetry.py): the node's memory figure is seen during the
    # CUDA job's 8 s hold (at the default 10 s it may never be).
    platform = Platform(tmp_path_factory.mktemp("platform"), name="gpuplatform_e2e_gpu",
                        own_redis=True, env={"GPUPLATFORM_GPU_SAMPLE_SECONDS": "1"})  # fmt: skip
    try:
        platform.start({})
        platform.start_agent(NODE, SKU, len(gpus), fake=False)  # NVML's GPUs
        platform.wait_until(platform.ready, timeout=90, what="the real agent registered")
        yield platform
    finally:
        print("\n--- agent log\n" + platform.logs(f"agent-{NODE}", 6000))
        platform.stop()


def test_the_agent_registers_what_nvml_finds(platform, gpus):
    node = platform.nodes()[NODE]
    print("node:", json.dumps(node))
    assert node["sku"] == SKU
    assert [(g["index"], g["uuid"], g["memory_mib"]) for g in node["gpus"]] == [
        (g["index"], g["uuid"], g["memory_mib"]) for g in gpus
    ]
    assert all(g["health"] == "healthy" for g in node["gpus"]), node["gpus"]


def test_a_cuda_job_runs_on_the_gpu_it_was_given(platform, gpus):
    job = platform.submit("bob", command=python(CUDA_JOB), gpus=1, gpu_sku=SKU,
                          env={"HOLD_SECONDS": "8"})  # fmt: skip
    running = platform.wait_for_state(job["id"], ["running", "succeeded", "failed"], timeout=120)
    [placement] = running["attempts"][-1]["placements"]
    [index] = placement["gpu_indices"]
    used = 0
    while platform.job(job["id"])["state"] == "running":  # the node's telemetry while it runs
        gpu = next(g for g in platform.nodes()[NODE]["gpus"] if g["index"] == index)
        used = max(used, gpu["memory_used_mib"] or 0)
        time.sleep(0.5)
    done = platform.wait_for_state(job["id"], ["succeeded", "failed"], timeout=60)
    log = platform.get("bob", f"/api/v1/jobs/{job['id']}/logs/").text
    print(log)
    assert done["state"] == "succeeded", (done["reason"], log)
    result = platform.get("bob", f"/api/v1/jobs/{job['id']}/artifacts/result.json").json()
    assert result["uuid"] == gpus[index]["uuid"] and result["name"] == gpus[index]["name"]
    assert result["count"] == 1 and result["products"] > 0 and result["finite"]
    assert used >= 4096, f"NVML showed {used} MiB used on GPU {index} while the job held 4 GiB"


def test_a_job_given_no_gpu_cannot_reach_one(platform, gpus):
    if platform.nodes()[NODE]["isolation"] == "none":
        pytest.skip("this agent runs unfenced here (not root, or no cgroups): nothing to prove")
    job = platform.submit("bob", command=python(NO_GPU_JOB), gpus=0)
    done = platform.wait_for_state(job["id"], ["succeeded", "failed"], timeout=120)
    log = platform.get("bob", f"/api/v1/jobs/{job['id']}/logs/").text
    print(log)
    assert done["state"] == "succeeded", (done["reason"], log)
    seen = json.loads(log.split("fence ", 1)[1].splitlines()[0])
    assert seen["devices"] and "opened" not in seen["devices"].values(), seen
    assert not seen["cuda"] and seen["count"] == 0, seen
