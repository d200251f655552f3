"""Honest waiting on the live platform (issue 30, API.md "Honest waiting"): the web, a dispatcher
with its beat, agents and the autoscaler's local provider as real processes.

- a job behind a running job of known length (its `max_runtime_seconds`) gets an estimate from
  the dispatcher's plan, inside its window, that does not move with the clock, and a reason that
  names the same time;
- another tenant's reason holds no foreign job id and no epoch number;
- a submit no node could run is a 400 saying what fits; the largest that fits and a gang across
  nodes are 201;
- a job only a node being added can run says so, with the node's ready time.
"""

import re
import time
from datetime import datetime

import pytest

from tests.e2e.platform import Platform
from tests.e2e.test_autoscale import _kill_autoscaled

pytestmark = pytest.mark.e2e
NODES = {
    "w-h1": ("H100-80GB", 4, "zone=a"),
    "w-a1": ("A100-40GB", 2, "zone=a"),
    "w-a2": ("A100-40GB", 2, "zone=b"),
}
L4 = "L4-24GB"
EPOCH = re.compile(r"\b1\d{9}\b")
LIMIT = 25  # the running job's known length: its work takes longer, its limit stops it


def ts(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


@pytest.fixture(scope="module")
def live(tmp_path_factory):
    platform = Platform(
        tmp_path_factory.mktemp("waiting"), name="gpuplatform_e2e_waiting", redis_db=5
    )
    platform.env["GPUPLATFORM_AUTOSCALE_TICK_SECONDS"] = "1"
    try:
        platform.start(NODES)
        platform.manage("shell", "-c", (
            "from apps.nodes.models import GpuSku; from apps.scheduling.models import AutoscalePolicy; "
            f"sku, _ = GpuSku.objects.get_or_create(name='{L4}'); "
            "AutoscalePolicy.objects.create(sku=sku, mode='reactive', gpus_per_node=2, min_nodes=0, "
            "max_nodes=1, provision_lag_seconds=30, cooldown_seconds=600)"
        ))  # fmt: skip
        yield platform
    finally:
        _kill_autoscaled(platform)
        platform.stop()


def planned(platform, user, job_id, timeout=30.0) -> dict:
    """The job once the dispatcher's plan gave it a window (the 201 predates any plan)."""
    found: dict = {}

    def has_window():
        found.update(platform.get(user, f"/api/v1/jobs/{job_id}/").json())
        return found.get("estimated_start_window") is not None

    platform.wait_until(has_window, timeout=timeout, what=f"a planned estimate for {job_id}")
    return found


def test_unsatisfiable_submits_are_400s_that_say_what_fits_and_their_controls_201(live):
    def post(**body):
        return live.post("bob", "/api/v1/jobs/", {"template": "demo-train", "params": {"steps": 1},
                                                  **body})  # fmt: skip

    nine = post(gpus=5, gpu_sku="H100-80GB")
    assert nine.status_code == 400 and "at most 4 per node" in nine.json()["gpus"][0], nine.text
    three = post(gpus=3, gpu_sku="A100-40GB")
    assert three.status_code == 400 and "at most 2 per node" in three.json()["gpus"][0]
    zone = post(gpus=1, gpu_sku="A100-40GB", node_selector={"zone": "c"})
    assert zone.status_code == 400 and "zone=a" in zone.json()["node_selector"][0], zone.text
    unknown = post(gpus=1, gpu_sku="V100-16GB")
    assert unknown.status_code == 400 and "gpu_sku" in unknown.json()
    # The controls: the largest job that fits, a gang across nodes, an autoscaled pool's shape.
    for body in ({"gpus": 4, "gpu_sku": "H100-80GB"},
                 {"gpus": 2, "nodes": 2, "gpu_sku": "A100-40GB"}):  # fmt: skip
        created = post(**body)
        assert created.status_code == 201, created.text
        live.post("bob", f"/api/v1/jobs/{created.json()['id']}/cancel/")


def test_an_estimate_from_the_plan_inside_its_window_that_the_clock_does_not_move(live):
    running = live.submit("bob", template="demo-train", gpu_sku="H100-80GB", gpus=4,
                          max_runtime_seconds=LIMIT, params={"steps": 1000, "step_seconds": 0.1})  # fmt: skip
    started = live.wait_for_state(running["id"], "running", timeout=60)
    mine = live.submit("bob", template="demo-train", gpu_sku="H100-80GB", gpus=4,
                       params={"steps": 1, "step_seconds": 0.1})  # fmt: skip
    theirs = live.submit("dave", template="demo-train", gpu_sku="H100-80GB", gpus=4,
                         params={"steps": 1, "step_seconds": 0.1})  # fmt: skip
    first = planned(live, "bob", mine["id"])
    start = ts(first["estimated_start_at"])
    earliest, latest = (ts(t) for t in first["estimated_start_window"])
    assert earliest <= start <= latest, first
    # No history: the running job is planned to run to its limit, from its attempt's start.
    placed = ts(started["attempts"][-1]["placed_at"])
    assert 0 <= (start - placed).total_seconds() - LIMIT < 10, (start, placed)
    assert first["queue_position"] == 1
    assert f"; expected to start {start:%Y-%m-%dT%H:%M:%S}Z (in ~" in first["reason"], first
    time.sleep(3)  # the clock moves, the estimate does not
    again = live.get("bob", f"/api/v1/jobs/{mine['id']}/").json()
    assert again["estimated_start_at"] == first["estimated_start_at"], (first, again)

    other = planned(live, "dave", theirs["id"])
    for foreign in (running["id"], mine["id"], running["id"][:8], mine["id"][:8]):
        assert foreign not in other["reason"], other["reason"]
    assert not EPOCH.search(other["reason"]), other["reason"]
    assert ts(other["estimated_start_at"]) >= start and other["queue_position"] == 2

    ran = live.wait_for_state(mine["id"], ("running", "succeeded"), timeout=LIMIT + 60)
    began = ts(ran["attempts"][-1]["placed_at"])
    assert earliest <= began, (earliest, began)
    assert (began - latest).total_seconds() < 20, (began, latest)  # the kill grace, a pass or two
    live.post("dave", f"/api/v1/jobs/{theirs['id']}/cancel/")


def test_a_job_for_an_autoscaled_pool_waits_for_the_node_being_added(live):
    job = live.submit("bob", template="demo-train", gpu_sku=L4, gpus=2, params={"steps": 1})

    def says_provisioning():
        reason = live.job(job["id"], "bob")["reason"]
        return reason.startswith("waiting for a node being added: ready at ")

    live.wait_until(says_provisioning, timeout=40, what="the provisioning reason")
    shown = live.job(job["id"], "bob")
    assert re.search(r"ready at \d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ \(in ~\d+ s\)", shown["reason"]), (
        shown
    )
    assert shown["estimated_start_at"] is not None and not EPOCH.search(shown["reason"])
    live.post("bob", f"/api/v1/jobs/{job['id']}/cancel/")
