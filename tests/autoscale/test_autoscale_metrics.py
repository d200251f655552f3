"""Autoscaling is visible in /metrics: nodes now, desired, pending, the last decision's reason."""

from prometheus_client.parser import text_string_to_metric_families

from apps.nodes.models import GpuSku
from apps.scheduling.models import AutoscalePolicy, ProvisionRequest, ScaleEvent


def test_metrics_show_the_autoscalers_state(client, db):
    from django.utils import timezone

    sku = GpuSku.objects.create(name="L4-24GB")
    AutoscalePolicy.objects.create(sku=sku, mode="reactive", gpus_per_node=2, max_nodes=3)
    ProvisionRequest.objects.create(
        sku=sku, node_name="auto-1", provider="local", gpus=2, ready_at=timezone.now()
    )
    ScaleEvent.objects.create(
        sku=sku, current=0, pending=0, desired=1, provision=1, reason="1 node(s) for queued work"
    )
    families = {
        f.name: f for f in text_string_to_metric_families(client.get("/metrics").content.decode())
    }
    [desired] = families["gpuplatform_autoscale_desired_nodes"].samples
    assert (desired.labels["sku"], desired.value) == ("L4-24GB", 1)
    assert families["gpuplatform_autoscale_pending_nodes"].samples[0].value == 1
    assert (
        "queued work" in families["gpuplatform_autoscale_last_decision"].samples[0].labels["reason"]
    )
