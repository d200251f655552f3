"""GPU telemetry on a real GPU (skipped without NVML, as tests/gpu/test_real_gpu.py): a CUDA
matmul job reads utilisation above 50% and memory above the 4 GiB it allocated, from NVML
through the agent's samples (every second here) to `GET /api/v1/jobs/{id}/metrics/`."""

from __future__ import annotations

import json

import pytest

from tests.e2e.platform import Platform
from tests.gpu.test_real_gpu import CUDA_JOB, NODE, SKU, gpus, python  # noqa: F401 (a fixture)

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def platform(gpus, tmp_path_factory):  # noqa: F811 (gpus: the fixture imported above)
    platform = Platform(tmp_path_factory.mktemp("platform"), name="gpuplatform_e2e_gpu_telemetry",
                        own_redis=True, env={"GPUPLATFORM_GPU_SAMPLE_SECONDS": "1"})  # fmt: skip
    try:
        platform.start({})
        platform.start_agent(NODE, SKU, len(gpus), fake=False)
        platform.wait_until(platform.ready, timeout=90, what="the real agent registered")
        yield platform
    finally:
        print("\n--- agent log\n" + platform.logs(f"agent-{NODE}", 6000))
        platform.stop()


def test_a_cuda_matmul_job_reads_busy_and_above_the_memory_it_allocated(platform):
    job = platform.submit("bob", command=python(CUDA_JOB), gpus=1, gpu_sku=SKU,
                          env={"HOLD_SECONDS": "15"})  # fmt: skip
    done = platform.wait_for_state(job["id"], ["succeeded", "failed"], timeout=180)
    log = platform.get("bob", f"/api/v1/jobs/{job['id']}/logs/").text
    assert done["state"] == "succeeded", (done["reason"], log)
    body = platform.get("bob", f"/api/v1/jobs/{job['id']}/metrics/").json()
    print(json.dumps(body["summary"]), len(body["samples"]), "samples")
    assert body["gpus"] and body["gpus"][0]["uuid"].startswith("GPU-")
    assert body["summary"]["util_max"] > 50, body["summary"]
    assert body["summary"]["memory_max_mib"] > 4096, body["summary"]  # it held 4 GiB and more
    assert len(body["samples"]) >= 5
