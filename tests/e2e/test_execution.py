"""Execution you can trust: preemption with checkpoints, through real processes."""

import pytest

pytestmark = pytest.mark.e2e


def test_an_enterprise_job_preempts_a_free_job_which_resumes_from_its_checkpoint(platform):
    train = {"template": "demo-train", "gpu_sku": "H100-80GB", "gpus": 2}
    free = [
        platform.submit("erin", **train, params={"steps": 60, "step_seconds": 0.1})["id"]
        for _ in range(2)
    ]
    for job_id in free:
        platform.wait_for_state(job_id, "running")
    platform.wait_until(lambda: all(platform.job(j)["progress"] >= 0.1 for j in free), timeout=30,
                        what="both free jobs to make progress")  # fmt: skip

    urgent = platform.submit("bob", **train, params={"steps": 3, "step_seconds": 0.05})
    done = platform.wait_for_state(urgent["id"], "succeeded", timeout=60)

    victims = [j for j in free if platform.job(j)["attempts"][0]["state"] == "preempted"]
    assert len(victims) == 1  # one victim was enough, and no preemption loop took the other
    victim = platform.job(victims[0])
    first = victim["attempts"][0]
    assert first["checkpoint"]  # it saved before it stopped
    # The victim stopped within its grace period (5 s for free) and the enterprise job then ran.
    from tests.e2e.test_foundation import _ts

    assert _ts(first["ended_at"]) - _ts(done["created_at"]) < 5 + 3
    assert _ts(done["attempts"][0]["started_at"]) >= _ts(first["ended_at"])

    finished = platform.wait_for_state(victims[0], "succeeded", timeout=120)
    assert [a["state"] for a in finished["attempts"]] == ["preempted", "succeeded"]
    result = platform.get("erin", f"/api/v1/jobs/{victims[0]}/artifacts/result.json").json()
    assert result["resumed_from_step"] > 0  # resumed at its checkpoint step, not step 0
    other = [j for j in free if j not in victims][0]
    assert [
        a["state"] for a in platform.wait_for_state(other, "succeeded", timeout=120)["attempts"]
    ] == ["succeeded"]
