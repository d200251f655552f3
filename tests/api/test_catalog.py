"""What a new user looks up before a submit: the templates (`GET /api/v1/templates/`) and the free
GPUs per SKU (`GET /api/v1/capacity/`). Both for any signed-in caller; capacity is counts only,
never node names or whose jobs hold the GPUs."""

import pytest

from apps.nodes.models import Gpu, GpuHealth, NodeState
from apps.scheduling import dispatcher
from tests.factories import make_node

GOOD = {"template": "demo-train", "params": {"steps": 3}, "gpus": 2, "gpu_sku": "H100-80GB"}


def test_templates_list_each_with_its_parameters(as_user):
    response = as_user("dave").get("/api/v1/templates/")
    assert response.status_code == 200
    templates = {t["name"]: t for t in response.json()}
    assert {"demo-train", "demo-infer"} <= set(templates)
    assert templates["demo-train"]["params"]["steps"]["type"] == "integer"
    assert templates["demo-train"]["checkpointable"] is True
    one = as_user("bob").get("/api/v1/templates/demo-infer/")
    assert one.status_code == 200 and one.json()["cacheable"] is True
    assert as_user("bob").get("/api/v1/templates/nope/").status_code == 404
    assert as_user(None).get("/api/v1/templates/").status_code == 401


def test_capacity_counts_free_gpus_per_sku_and_names_no_node(as_user):
    make_node("a1", "A100-40GB", 4)
    make_node("a2", "A100-40GB", 4).__class__.objects.filter(name="a2").update(
        state=NodeState.CORDONED
    )
    Gpu.objects.filter(node__name="h1", index=7).update(health=GpuHealth.UNHEALTHY)
    assert as_user("bob").post("/api/v1/jobs/", GOOD, format="json").status_code == 201
    dispatcher.dispatch_once()

    response = as_user("dave").get("/api/v1/capacity/")
    assert response.status_code == 200
    assert response.json() == {"skus": [
        {"sku": "A100-40GB", "nodes": 1, "gpus": 4, "free": 4, "most_free_on_one_node": 4,
         "unavailable_nodes": 1},
        {"sku": "H100-80GB", "nodes": 1, "gpus": 8, "free": 5, "most_free_on_one_node": 5,
         "unavailable_nodes": 0},
    ]}  # fmt: skip
    assert b"h1" not in response.content and b"bob" not in response.content
    assert as_user(None).get("/api/v1/capacity/").status_code == 401


@pytest.mark.parametrize("path", ["/api/v1/templates/", "/api/v1/capacity/"])
def test_the_document_lists_them(as_user, path):
    document = as_user("bob").get("/api/schema/", {"format": "json"}).json()
    assert "get" in document["paths"][path]
