"""Admission on the real platform (gunicorn, dispatcher, agents, Redis, its own database)."""

import concurrent.futures
from datetime import datetime

import pytest

from tests.e2e.platform import Platform

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def platform(tmp_path_factory):
    platform = Platform(
        tmp_path_factory.mktemp("admission"), name="gpuplatform_admission_e2e", redis_db=5
    )
    try:
        platform.start({"adm-h1": ("H100-80GB", 8, "")})
        platform.manage("set_quota", "acme", "--max-gpus", "H100-80GB=6", "--submit-rate", "100000",
                        "--submit-burst", "100000")  # fmt: skip
        yield platform
    finally:
        platform.stop()


def ts(text: str) -> float:
    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


def test_sixteen_concurrent_jobs_against_a_six_gpu_cap_never_run_more_than_six_gpus(platform):
    body = {"command": ["sleep", "0.5"], "gpus": 1, "gpu_sku": "H100-80GB"}
    with concurrent.futures.ThreadPoolExecutor(16) as pool:
        ids = [job["id"] for job in pool.map(lambda _: platform.submit("bob", **body), range(16))]
    jobs = [platform.wait_for_state(job_id, ["succeeded", "failed"], timeout=120) for job_id in ids]

    assert {job["state"] for job in jobs} == {"succeeded"}
    spans = [(ts(a["placed_at"]), ts(a["ended_at"])) for job in jobs for a in job["attempts"]]
    most = max(sum(1 for start, end in spans if start <= moment < end) for moment, _ in spans)
    assert most <= 6
