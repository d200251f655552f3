"""The Python SDK against the real platform (gunicorn gthread workers): the event stream shows
every state of a job in order across reconnects, and /metrics moves as jobs run."""

import pytest
import requests
from prometheus_client.parser import text_string_to_metric_families

from gpuplatform.client import ApiError, Client

pytestmark = pytest.mark.e2e


def scrape(platform) -> dict:
    text = requests.get(platform.url + "/metrics", timeout=30).text
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}  # fmt: skip


def test_the_event_stream_shows_every_state_in_order_across_reconnects(platform):
    client = Client(platform.url, platform.tokens["alice"])
    before = scrape(platform)
    job = client.submit(
        template="demo-train", params={"steps": 8, "step_seconds": 0.4}, gpus=1, gpu_sku="A100-40GB"
    )
    # One-second streams: the ~4 s job spans several connections, resumed with Last-Event-ID.
    events = list(client.follow(job["id"], stream_seconds=1, deadline=None))
    states = [e.data["to"] for e in events if e.event == "state"]
    assert states == ["queued", "starting", "running", "succeeded"]
    progress = [e.data["progress"] for e in events if e.event == "progress"]
    assert progress == sorted(progress) and progress[-1] == 1.0 and len(set(progress)) >= 3
    lines = [e.data["line"] for e in events if e.event == "log"]
    assert [line for line in lines if line.startswith("step ")] == [
        f"step {n}/8 loss={1.0 / n:.4f}" for n in range(1, 9)
    ]
    assert events[-1].event == "end" and events[-1].data["state"] == "succeeded"

    after = scrape(platform)
    key = ("gpuplatform_job_wait_seconds_count", (("tier", "enterprise"),))
    assert after[key] >= before.get(key, 0) + 1
    assert after[("gpuplatform_dispatch_passes_total", ())] > 0  # written by the dispatcher process
    assert ("gpuplatform_node_heartbeat_age_seconds", (("node", "ui-a1"),)) in after


def test_the_stream_is_404_for_another_tenant(platform):
    job = Client(platform.url, platform.tokens["bob"]).submit(
        template="demo-train", params={"steps": 1}, gpus=1
    )
    with pytest.raises(ApiError) as refused:
        list(Client(platform.url, platform.tokens["dave"]).events(job["id"], timeout=1))
    assert refused.value.status == 404
