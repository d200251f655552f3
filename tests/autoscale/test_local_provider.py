"""The local provider's fake nodes (apps/scheduling/providers.py) leave nothing behind when
terminated: no zombie under the dispatcher, no series in /metrics, no "Healthy" GPU in the admin."""

import os
import pathlib
import sys
import time
from datetime import timedelta

import pytest
from django.test import Client
from django.utils import timezone

from apps.nodes.models import Node
from apps.scheduling import providers
from apps.scheduling.models import AutoscalePolicy, ProvisionRequest, ProvisionState
from tests.factories import make_node
from tests.web.test_metrics import scrape, value


def process_state(pid: int) -> str | None:
    """The kernel's one-letter state of `pid` (Z: a zombie), None when it is gone."""
    try:
        stat = pathlib.Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return None
    return stat.rsplit(")", 1)[1].split()[0]


@pytest.fixture
def local_node(db, monkeypatch):
    """A provisioned local node whose "agent" is a sleeping Python (no agent, no credentials)."""
    monkeypatch.setattr(providers, "_agent_argv", lambda request, labels: [
        sys.executable, "-c", "import time; time.sleep(600)"])  # fmt: skip
    monkeypatch.setattr(providers, "_agent_environment", lambda name: {"PATH": os.environ["PATH"]})
    monkeypatch.setattr(providers.LocalProvider, "_revoke", lambda self, node: None)
    node = make_node("auto-l4-1", sku="L4-24GB", gpus=2)
    Node.objects.filter(pk=node.pk).update(last_heartbeat_at=timezone.now() - timedelta(seconds=5))
    AutoscalePolicy.objects.create(sku=node.sku, mode="reactive", gpus_per_node=2, max_nodes=3)
    ProvisionRequest.objects.create(sku=node.sku, node_name=node.name, provider="local", gpus=2,
                                    ready_at=timezone.now() - timedelta(seconds=1))  # fmt: skip
    return node


def test_a_terminated_local_agent_is_reaped_not_left_a_zombie(local_node):
    provider = providers.LocalProvider()
    provider.advance()
    request = ProvisionRequest.objects.get(node_name=local_node.name)
    assert request.state == ProvisionState.RUNNING and process_state(request.pid) not in (None, "Z")
    provider.terminate(Node.objects.get(pk=local_node.pk))
    deadline = time.monotonic() + 60
    while process_state(request.pid) is not None and time.monotonic() < deadline:
        time.sleep(0.2)
    assert process_state(request.pid) is None  # "Z" without the reaper, for the dispatcher's life


def test_a_terminated_node_leaves_metrics_and_its_gpus_show_as_gone(local_node, django_user_model):
    before = scrape()
    assert value(before, "gpuplatform_gpus_total", sku="L4-24GB") == 2
    assert value(before, "gpuplatform_node_heartbeat_age_seconds", node=local_node.name) >= 4
    providers.LocalProvider().terminate(local_node)  # no process was started: only the node's row
    after = scrape()
    assert ("gpuplatform_gpus_total", (("sku", "L4-24GB"),)) not in after
    assert ("gpuplatform_node_heartbeat_age_seconds", (("node", local_node.name),)) not in after
    assert ("gpuplatform_nodes", (("state", "terminated"),)) not in after  # not a state that grows
    assert value(after, "gpuplatform_nodes_terminated_total") == 1
    staff = django_user_model.objects.create_superuser("root", password="x")
    client = Client()
    client.force_login(staff)
    listing = client.get("/admin/nodes/gpu/").content.decode()
    assert listing.count("gone (node terminated)") == 2 and "Healthy</td>" not in listing
    page = client.get(f"/admin/nodes/node/{local_node.pk}/change/").content.decode()
    assert page.count("gone (node terminated)") == 2 and "Healthy" not in page
    # The agent's last report is kept as it came: the data says healthy, the display says gone.
    assert set(local_node.gpus.values_list("health", flat=True)) == {"healthy"}
