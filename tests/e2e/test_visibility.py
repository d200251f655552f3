"""Celery issue 5935: with the Redis broker, a message not acknowledged within the visibility
timeout is delivered again while the first delivery may still be at work. Here the timeout is 1 s
and each job runs ~6 s: each still runs once, because the job is not a task (the start message is
a hand-off the runner takes once, and the attempt's token fences every report)."""

import re

import pytest

from tests.e2e.platform import Platform

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def platform(tmp_path_factory):
    platform = Platform(tmp_path_factory.mktemp("visibility"), name="gpuplatform_e2e_visibility", redis_db=4,
                        env={"GPUPLATFORM_VISIBILITY_TIMEOUT": "1"})  # fmt: skip
    try:
        yield platform.start({"vt-h1": ("H100-80GB", 4, "")})
    finally:
        platform.stop()


def test_jobs_longer_than_the_visibility_timeout_run_once(platform):
    options = platform.manage(
        "shell",
        "-c",
        "from django.conf import settings; print(settings.CELERY_BROKER_TRANSPORT_OPTIONS)",
    )
    assert "'visibility_timeout': 1" in options
    train = {
        "template": "demo-train",
        "gpu_sku": "H100-80GB",
        "gpus": 1,
        "params": {"steps": 30, "step_seconds": 0.2},
    }
    ids = [platform.submit("bob", **train)["id"] for _ in range(3)]
    for job_id in ids:
        done = platform.wait_for_state(job_id, ["succeeded", "failed"], timeout=120)
        assert done["state"] == "succeeded"
        assert [a["state"] for a in done["attempts"]] == ["succeeded"]  # one attempt
        log = platform.get("bob", f"/api/v1/jobs/{job_id}/logs/").text
        assert (
            log.count("starting at step") == 1 and "step 30/30" in log
        )  # one start, ran to the end
    # The agent launched each attempt once, whatever the broker delivered.
    launches = re.findall(r"started attempt (\d+) rank 0", platform.logs("agent-vt-h1", tail=10**7))
    assert len(launches) == len(set(launches)) == 3
