"""GPU telemetry end to end (docs/telemetry.md), with fake agents on real processes: a fake GPU
reads its job's CPU use and resident memory, so a busy job reads busy and a sleeping one idle;
a gang has samples from both its nodes; another tenant gets 404; the per-job /metrics series
go with the job; an idle free job is warned, then cancelled, or requeued from its checkpoint;
a GPU with an XID takes no new work and its job hears of it.

Its own platform: agents sample every 0.5 s, an idle-policy "minute" lasts 2 s, and a GPU reads
idle below 20% (a fake GPU's demo-train step, its checkpoint and progress report, takes a few
percent of a loaded CPU now and then; a sleeping process reads 0)."""

import json
import re
import time

import pytest

from tests.e2e.platform import Platform
from tests.e2e.terminal import CLIENT, Terminal
from tests.e2e.test_interactive import attached, client_env

pytestmark = pytest.mark.e2e
SKU = "H100-80GB"
BUSY = ["python3", "-c", "x = bytearray(96 << 20); exec('while True: x[0] = (x[0] + 1) % 256')"]
SLEEPY = ["python3", "-c", "import time; x = bytearray(24 << 20); time.sleep(300)"]
IDLE_TRAIN = {"template": "demo-train", "gpu_sku": SKU, "gpus": 1,
              "params": {"steps": 300, "step_seconds": 2}}  # fmt: skip


@pytest.fixture(scope="module")
def platform(tmp_path_factory):
    platform = Platform(tmp_path_factory.mktemp("telemetry"), name="gpuplatform_e2e_telemetry",
                        redis_db=5, env={"GPUPLATFORM_GPU_SAMPLE_SECONDS": "0.5",
                                         "GPUPLATFORM_GPU_IDLE_MINUTE_SECONDS": "2",
                                         "GPUPLATFORM_GPU_IDLE_UTIL": "20"})  # fmt: skip
    try:
        yield platform.start({"tel-h1": (SKU, 2, "rack=r1"), "tel-h2": (SKU, 2, "rack=r2")})
    finally:
        platform.stop()


def metrics(platform, job_id: str, user: str = "bob") -> dict:
    answer = platform.get(user, f"/api/v1/jobs/{job_id}/metrics/")
    assert answer.status_code == 200, answer.text
    return answer.json()


def placed_gpus(platform, job_id: str) -> set[tuple[str, int]]:
    """The GPUs the job's latest attempt holds, on every node of a gang."""
    attempt = max(platform.job(job_id)["attempts"], key=lambda a: a["number"])
    return {(p["node"], index) for p in attempt["placements"] for index in p["gpu_indices"]}


def sampled(platform, job_id: str, count: int, user: str = "bob") -> dict:
    """The job's metrics once each GPU it holds has at least `count` samples: every GPU of its
    placement, not only those sampled so far, since a gang's ranks start apart (the one on a
    node whose fork server starts cold, or without a spare launcher, a second or more after
    the other: its GPUs have no series yet when the first node's have 3 samples)."""
    body: dict = {}
    gpus = placed_gpus(platform, job_id)

    def enough() -> bool:
        nonlocal body
        body = metrics(platform, job_id, user)
        per_gpu: dict = {}
        for s in body["samples"]:
            per_gpu[(s["node"], s["index"])] = per_gpu.get((s["node"], s["index"]), 0) + 1
        return bool(gpus) and all(per_gpu.get(gpu, 0) >= count for gpu in gpus)

    platform.wait_until(enough, timeout=60, what=f"{count} samples per GPU of job {job_id}")
    return body


def gauges(platform, name: str) -> dict[str, float]:
    from prometheus_client.parser import text_string_to_metric_families

    text = platform.get(None, "/metrics").text
    return {s.labels["job"]: s.value for f in text_string_to_metric_families(text)
            for s in f.samples if s.name == name}  # fmt: skip


def test_a_busy_job_reads_busy_a_sleeping_one_idle_and_their_series_go_at_their_end(platform):
    busy = platform.submit("bob", command=BUSY, gpus=1, gpu_sku=SKU)["id"]
    sleepy = platform.submit("bob", command=SLEEPY, gpus=1, gpu_sku=SKU)["id"]
    for job_id in (busy, sleepy):
        platform.wait_for_state(job_id, "running")
    hot, cold = sampled(platform, busy, 6), sampled(platform, sleepy, 6)
    # Generous bounds: two loaded cores shared with everything else on this machine.
    assert hot["summary"]["util_max"] >= 15 and hot["summary"]["util_mean"] >= 5
    # The sleeping job: idle once started (its first samples may still hold Python's start).
    assert max(s["util"] for s in cold["samples"][2:]) < 10
    assert hot["summary"]["memory_max_mib"] >= 96  # its resident memory
    assert 24 <= cold["summary"]["memory_max_mib"] < 96
    assert cold["summary"]["idle_seconds"] > 1
    assert [s["t"] for s in hot["samples"]] == sorted(s["t"] for s in hot["samples"])

    # The job's event stream carries its new samples (`event: gpu`) while it runs.
    stream = platform.get("bob", f"/api/v1/jobs/{busy}/events/?timeout=4").text
    gpu_events = [m for m in stream.split("\n\n") if m.startswith("id:") and "event: gpu\n" in m]
    assert gpu_events, stream[-2000:]
    data = json.loads(gpu_events[-1].split("data: ", 1)[1])
    assert {s["index"] for s in data["samples"]} == {hot["gpus"][0]["index"]}

    # Another tenant: 404, as for the job itself.
    assert platform.get("dave", f"/api/v1/jobs/{busy}/metrics/").status_code == 404

    # /metrics: both running jobs' GPUs; a job's series gone once it has ended.
    util = gauges(platform, "gpuplatform_job_gpu_utilization")
    assert {busy, sleepy} <= set(util)
    assert gauges(platform, "gpuplatform_job_gpu_memory_bytes")[busy] >= 96 << 20
    assert platform.post("bob", f"/api/v1/jobs/{busy}/cancel/").status_code == 200
    platform.wait_until(lambda: busy not in gauges(platform, "gpuplatform_job_gpu_utilization"),
                        timeout=30, what="the cancelled job's series to leave /metrics")  # fmt: skip
    assert sleepy in gauges(platform, "gpuplatform_job_gpu_utilization")
    platform.post("bob", f"/api/v1/jobs/{sleepy}/cancel/")
    platform.wait_until(lambda: not gauges(platform, "gpuplatform_job_gpu_utilization"),
                        timeout=30, what="no running job's series left")  # fmt: skip
    # The stored series stays with the job.
    assert metrics(platform, busy)["summary"]["util_max"] >= 15

    usage = platform.get("bob", "/api/v1/usage/").json()
    assert usage["gpu_hours_utilized"] > 0 and 0 < usage["gpu_efficiency"] <= 1
    bob = next(u for u in usage["by_user"] if u["user"] == "bob")
    assert bob["gpu_hours_allocated"] >= bob["gpu_hours_utilized"] > 0


def test_a_gang_has_samples_from_both_its_nodes(platform):
    job = platform.submit("bob", command=BUSY, gpus=2, nodes=2, gpu_sku=SKU)["id"]
    platform.wait_for_state(job, "running")
    body = sampled(platform, job, 3)
    assert sorted((g["node"], g["index"]) for g in body["gpus"]) == [
        ("tel-h1", 0), ("tel-h1", 1), ("tel-h2", 0), ("tel-h2", 1)]  # fmt: skip
    assert {s["node"] for s in body["samples"]} == {"tel-h1", "tel-h2"}
    assert {s["rank"] for s in body["samples"]} == {0, 1}
    platform.post("bob", f"/api/v1/jobs/{job}/cancel/")
    platform.wait_for_state(job, "cancelled")
    platform.wait_until(lambda: job not in gauges(platform, "gpuplatform_job_gpu_utilization"),
                        timeout=30, what="the gang's series to leave /metrics")  # fmt: skip


def test_an_idle_free_job_is_warned_then_cancelled(platform):
    # Warn after 1 "minute" (2 s here) of idle GPUs, cancel after 3 (6 s).
    platform.manage("set_tier", "free", "--gpu-idle-warn-minutes", "1", "--gpu-idle-minutes",
                    "3", "--gpu-idle-action", "cancel")  # fmt: skip
    job = platform.submit("erin", **IDLE_TRAIN)["id"]
    done = platform.wait_for_state(job, "cancelled", timeout=90)
    assert "GPUs idle for" in done["reason"] and "limit is 3 minutes" in done["reason"]
    logs = platform.get("erin", f"/api/v1/jobs/{job}/logs/").text
    (notice,) = [line for line in logs.splitlines() if line.startswith("[gpuplatform ")]
    assert "every GPU idle for" in notice and "then cancel" in notice
    events = platform.get("erin", f"/api/v1/jobs/{job}/events/")  # ends: the job has ended
    assert events.status_code == 200
    assert "event: gpu.idle" in events.text and '"limit_minutes": 3' in events.text


def test_an_idle_free_job_is_requeued_from_its_checkpoint(platform):
    platform.manage("set_tier", "free", "--gpu-idle-warn-minutes", "off", "--gpu-idle-minutes",
                    "3", "--gpu-idle-action", "requeue")  # fmt: skip
    job = platform.submit("erin", **IDLE_TRAIN)["id"]

    def requeued() -> bool:
        attempts = platform.job(job)["attempts"]
        return len(attempts) >= 2 and attempts[0]["state"] == "preempted"

    platform.wait_until(requeued, timeout=120, what="the idle job to be requeued")
    first = platform.job(job)["attempts"][0]
    assert first["checkpoint"]  # it resumes from there
    platform.manage("set_tier", "free", "--gpu-idle-action", "none")
    platform.wait_for_state(job, "running", timeout=60)
    platform.post("erin", f"/api/v1/jobs/{job}/cancel/")
    platform.wait_for_state(job, "cancelled")


def test_a_gpu_with_an_xid_takes_no_new_work_and_its_job_hears_of_it(platform):
    job = platform.submit("bob", command=SLEEPY, gpus=1, gpu_sku=SKU,
                          node_selector={"rack": "r1"})["id"]  # fmt: skip
    placed = platform.wait_for_state(job, "running")["attempts"][-1]["placements"][0]
    node, (index,) = placed["node"], placed["gpu_indices"]
    (platform.agent_dir(node) / "fake-gpu-errors").write_text(f"{index} xid 79\n")

    def unhealthy() -> bool:
        return {g["index"]: g["health"] for g in platform.nodes()[node]["gpus"]}[index] != "healthy"

    platform.wait_until(unhealthy, timeout=30, what=f"GPU {node}:{index} to be unhealthy")
    platform.wait_until(lambda: "xid 79" in platform.get("bob", f"/api/v1/jobs/{job}/logs/").text,
                        timeout=30, what="the job to hear of its GPU")  # fmt: skip
    platform.post("bob", f"/api/v1/jobs/{job}/cancel/")
    platform.wait_for_state(job, "cancelled")
    # Two GPUs on the node, one unhealthy: a job that needs both there waits.
    wants_both = platform.submit("bob", command=SLEEPY, gpus=2, gpu_sku=SKU,
                                 node_selector={"rack": "r1"})["id"]  # fmt: skip
    time.sleep(5)
    assert platform.job(wants_both)["state"] == "queued"
    platform.post("bob", f"/api/v1/jobs/{wants_both}/cancel/")


def typing(term, seconds: float, *, every: float = 0.3, until=None) -> None:
    """A person at the terminal: a line typed every `every` seconds (echoed), for `seconds` or
    until `until()` holds."""
    deadline = time.monotonic() + seconds
    k = 0
    while time.monotonic() < deadline and not (until and until()) and term.status is None:
        k += 1
        term.type(f"echo typed {k}\r")
        term.read_some(every)


def test_typing_keeps_an_interactive_job_alive_on_any_rank_and_silence_does_not(platform):
    unfenced = [n for n, node in platform.nodes().items() if node["isolation"] == "none"]
    if unfenced:
        pytest.skip(f"sessions need agents that fence jobs (isolation none: {unfenced})")
    # bob's tier (his tenant may run commands): warn after 1 "minute" (2 s) of idle GPUs,
    # cancel after 3 (6 s); the typing lasts 12 s.
    platform.manage("set_tier", "enterprise", "--gpu-idle-warn-minutes", "1",
                    "--gpu-idle-minutes", "3", "--gpu-idle-action", "cancel")  # fmt: skip
    try:
        typed_then_silent(platform)
    finally:
        platform.manage("set_tier", "enterprise", "--gpu-idle-warn-minutes", "off",
                        "--gpu-idle-minutes", "off", "--gpu-idle-action", "none")  # fmt: skip


def typed_then_silent(platform) -> None:
    job = platform.submit("bob", interactive=True, gpus=1, nodes=2, gpu_sku=SKU)["id"]
    platform.wait_for_state(job, "running", timeout=120)
    env = client_env(platform, "bob")
    shell = Terminal([*CLIENT, "shell", job], env)
    rank1 = Terminal([*CLIENT, "exec", job, "--rank", "1", "--", "sh"], env)

    def rank1_prompts() -> bool:
        rank1.read_some(0.05)
        return re.search(rb"[$#] ", rank1.output) is not None

    try:
        assert attached(shell) == job
        began = time.monotonic()
        typing(shell, 6)  # in the shell, on rank 0 (GPUs idle: no CPU)
        typing(shell, 60, until=rank1_prompts)  # ... until rank 1's exec is there too
        rank1.type("echo RANK=$RANK\r")
        rank1.expect("RANK=1", timeout=30)
        typing(rank1, 6)  # then only in an exec on rank 1 (rank 0's shell open but silent)
        assert time.monotonic() - began > 12  # twice the limit
        assert platform.job(job)["state"] == "running"
        logs = platform.get("bob", f"/api/v1/jobs/{job}/logs/").text
        assert "[gpuplatform " not in logs  # never warned
        # Both sessions stay open, nothing typed: warned, then cancelled at the limit.
        done = platform.wait_for_state(job, "cancelled", timeout=90)
    finally:
        shell.kill()
        rank1.kill()
    assert "GPUs idle for" in done["reason"] and "limit is 3 minutes" in done["reason"]
    logs = platform.get("bob", f"/api/v1/jobs/{job}/logs/").text
    (notice,) = [line for line in logs.splitlines() if line.startswith("[gpuplatform ")]
    assert "every GPU idle for" in notice
