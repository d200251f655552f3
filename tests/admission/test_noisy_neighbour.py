"""Noisy neighbour on the real platform (gunicorn, dispatcher, a fake 8-GPU node, Redis, its own
database): tenant A (initech) submits at ten times its rate while tenant B (globex) of the same
tier (pro) submits at its normal rate. B gets no 429 and its queue wait (created_at ->
started_at) stays what it is without A.

Both tenants get the same limits: 60 submits a minute (one a second), burst 3. Phase 1: B alone
submits one 1-GPU demo-train job a second for PHASE seconds. Phase 2: the same, while A fires ten
a second. A's bucket refuses most of them (429), so what reaches the queue from A is about its
own rate; the node has room for both, so B's jobs should wait no longer than before.

Why medians with slack and not the bare p95: a phase gives ~PHASE samples, so its p95 is its
largest one or two waits, and on a shared 2-core machine a single scheduling hiccup (a
dispatcher pass delayed by another process) moves it by a second. The test compares the median
(the typical wait) at 1.2x plus a 0.25 s allowance for the dispatcher's timer granularity, and
bounds p95 at 1.2x plus 1 s. Both figures are printed (`-s`) so a run can be read against the
issue's p95 target.
"""

import statistics
import threading
import time
from datetime import datetime

import pytest

from tests.e2e.platform import Platform

pytestmark = pytest.mark.e2e

PHASE = 15  # seconds per phase
RATE, BURST = 60, 3  # per minute, tokens: both tenants
JOB = {"template": "demo-train", "params": {"steps": 1, "step_seconds": 0}, "gpus": 1, "gpu_sku": "H100-80GB",
       "tier": "pro"}  # fmt: skip


@pytest.fixture(scope="module")
def platform(tmp_path_factory):
    platform = Platform(tmp_path_factory.mktemp("noisy"), name="gpuplatform_noisy_e2e", redis_db=6)
    try:
        platform.start({"noisy-h1": ("H100-80GB", 8, "")})
        out = platform.manage("shell", "-c", (
            "from apps.tenants.services import tenant_create, user_create\n"
            "tenant_create(slug='initech', tier_name='pro')\n"
            "print(user_create(username='nora', tenant_slug='initech')[1])"
        ))  # fmt: skip
        platform.tokens["nora"] = out.strip().splitlines()[-1]
        for slug in ("initech", "globex"):
            platform.manage(
                "set_quota", slug, "--submit-rate", str(RATE), "--submit-burst", str(BURST)
            )
        yield platform
    finally:
        platform.stop()


def ts(text: str) -> float:
    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


def paced(platform, user: str, per_second: float, seconds: float, codes: list, ids: list) -> None:
    session = platform.api(user)
    start, n = time.monotonic(), int(per_second * seconds)
    for i in range(n):
        response = session.post(platform.url + "/api/v1/jobs/", json=JOB, timeout=30)
        codes.append(response.status_code)
        if response.status_code == 201:
            ids.append(response.json()["id"])
        time.sleep(max(0.0, start + (i + 1) / per_second - time.monotonic()))


def waits(platform, ids: list[str]) -> list[float]:
    jobs = [platform.wait_for_state(job_id, ["succeeded", "failed"], timeout=60) for job_id in ids]
    assert {job["state"] for job in jobs} == {"succeeded"}
    return [ts(job["started_at"]) - ts(job["created_at"]) for job in jobs]


def p95(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(0.95 * (len(ordered) - 1)))]


def test_a_tenant_at_ten_times_its_rate_does_not_slow_a_quiet_tenant_of_its_tier(platform):
    quiet_codes, quiet_ids = [], []
    paced(platform, "dave", 1, PHASE, quiet_codes, quiet_ids)
    alone = waits(platform, quiet_ids)
    time.sleep(BURST)  # both buckets full again

    noisy_codes, noisy_ids, busy_codes, busy_ids = [], [], [], []
    noisy = threading.Thread(
        target=paced, args=(platform, "nora", 10, PHASE + 1, noisy_codes, noisy_ids)
    )
    noisy.start()
    try:
        time.sleep(0.5)
        paced(platform, "dave", 1, PHASE, busy_codes, busy_ids)
    finally:
        noisy.join()
    beside = waits(platform, busy_ids)
    waits(platform, noisy_ids)  # the noisy tenant's admitted jobs ran too

    figures = {
        "alone": (statistics.median(alone), p95(alone)),
        "beside A": (statistics.median(beside), p95(beside)),
    }
    print("B's queue wait (median, p95) in seconds:", {k: tuple(round(v, 3) for v in f) for k, f in figures.items()},
          f"A: {noisy_codes.count(201)} admitted, {noisy_codes.count(429)} refused")  # fmt: skip
    assert set(quiet_codes) == {201} and set(busy_codes) == {201}  # B never gets a 429
    assert noisy_codes.count(429) >= len(noisy_codes) // 2  # A really was over its rate
    assert noisy_codes.count(201) <= BURST + PHASE + 3  # A got its own rate, no more
    assert figures["beside A"][0] <= 1.2 * figures["alone"][0] + 0.25
    assert figures["beside A"][1] <= 1.2 * figures["alone"][1] + 1.0
