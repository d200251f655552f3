"""The local autoscaling demo: a burst of jobs makes fake nodes appear after the provisioning lag
and go away once idle, through the real dispatcher, beat and provider."""

import os
import signal

import pytest

from tests.e2e.platform import Platform
from tests.processes import alive

pytestmark = pytest.mark.e2e
SKU = "L4-24GB"


@pytest.fixture(scope="module")
def scaling_platform(tmp_path_factory):
    platform = Platform(
        tmp_path_factory.mktemp("autoscale"), name="gpuplatform_e2e_autoscale", redis_db=3
    )
    platform.env["GPUPLATFORM_AUTOSCALE_TICK_SECONDS"] = "1"
    try:
        platform.start({})
        platform.manage("shell", "-c", (
            "from apps.nodes.models import GpuSku; from apps.scheduling.models import AutoscalePolicy; "
            f"sku, _ = GpuSku.objects.get_or_create(name='{SKU}'); "
            "AutoscalePolicy.objects.create(sku=sku, mode='reactive', gpus_per_node=2, min_nodes=0, max_nodes=2, "
            "provision_lag_seconds=2, cooldown_seconds=4)"
        ))  # fmt: skip
        yield platform
    finally:
        _kill_autoscaled(platform)
        platform.stop()


def test_a_burst_brings_nodes_after_the_lag_and_idle_nodes_go_away(scaling_platform):
    platform = scaling_platform
    assert platform.nodes() == {}
    ids = [platform.submit("bob", template="demo-train", gpu_sku=SKU, gpus=2,
                           params={"steps": 10, "step_seconds": 0.2})["id"] for _ in range(3)]  # fmt: skip

    platform.wait_until(lambda: len(platform.nodes()) == 2, timeout=60, what="two autoscaled nodes")
    assert all(n["labels"].get("autoscaled") == "true" for n in platform.nodes().values())
    for job_id in ids:
        assert platform.wait_for_state(job_id, "succeeded", timeout=120)["state"] == "succeeded"

    # Idle past the cooldown, the nodes are given back and their agents stop.
    platform.wait_until(
        lambda: platform.nodes() == {}, timeout=60, what="the idle nodes to be terminated"
    )
    pids = _autoscaled_pids(platform)
    platform.wait_until(
        lambda: not any(alive(p) for p in pids), timeout=30, what="autoscaled agents to exit"
    )
    events = platform.manage("shell", "-c", "from apps.scheduling.models import ScaleEvent; "
                             "print([(e.provision, len(e.terminate)) for e in ScaleEvent.objects.order_by('created_at')])")  # fmt: skip
    decisions = eval(events.strip().splitlines()[-1])  # noqa: S307 (our own repr of ints)
    assert sum(p for p, _ in decisions) == 2  # never more than max_nodes, no flapping
    assert sum(t for _, t in decisions) == 2


def _autoscaled_pids(platform) -> list[int]:
    out = platform.manage("shell", "-c", "from apps.scheduling.models import ProvisionRequest; "
                          "print([r.pid for r in ProvisionRequest.objects.exclude(pid=None)])")  # fmt: skip
    return eval(out.strip().splitlines()[-1])  # noqa: S307


def _kill_autoscaled(platform) -> None:
    try:
        for pid in _autoscaled_pids(platform):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
    except Exception:  # the platform may not have started
        pass
