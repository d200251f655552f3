"""A submit no node could ever run is a 400 naming the field and saying what would fit
(apps/admission/fit.py, API.md "Honest waiting"); the largest job that fits, a gang across
nodes, and a job only an autoscaled pool or a draining node fits are accepted."""

import pytest
from rest_framework.exceptions import ValidationError

from apps.admission import fit
from apps.nodes.models import GpuSku, Node, NodeState
from apps.scheduling.models import AutoscaleMode, AutoscalePolicy
from tests.admission.conftest import TRAIN
from tests.factories import make_node


@pytest.fixture
def bob(as_user):
    fit.forget()
    make_node("a1", "A100-40GB", 4, labels={"zone": "a"})
    yield as_user("bob")
    fit.forget()


def post(client, **fields):
    return client.post("/api/v1/jobs/", {**TRAIN, **fields}, format="json")


def test_more_gpus_per_node_than_any_node_of_the_sku_is_a_400_saying_what_fits(bob):
    nine = post(bob, gpus=9)  # H100-80GB: one 8-GPU node (the cast's h1)
    assert nine.status_code == 400, nine.content
    assert "at most 8 per node" in nine.json()["gpus"][0]
    five = post(bob, gpus=5, gpu_sku="A100-40GB")
    assert five.status_code == 400 and "at most 4 per node" in five.json()["gpus"][0]
    # The controls: the largest that fits, and a gang across nodes of that size.
    assert post(bob, gpus=8).status_code == 201
    assert post(bob, gpus=4, gpu_sku="A100-40GB", nodes=3).status_code == 201


def test_a_sku_no_node_has_and_a_selector_no_node_matches_are_400s(bob):
    sku = GpuSku.objects.create(name="V100-16GB")
    gone = make_node("v1", "V100-16GB", 8)
    Node.objects.filter(pk=gone.pk).update(state=NodeState.TERMINATED)
    refused = post(bob, gpu_sku=sku.name)
    assert refused.status_code == 400 and "SKUs with nodes" in refused.json()["gpu_sku"][0]
    selector = post(bob, gpu_sku="A100-40GB", node_selector={"zone": "b"})
    assert selector.status_code == 400
    assert "zone=a" in selector.json()["node_selector"][0]  # what the nodes offer
    assert post(bob, gpu_sku="A100-40GB", node_selector={"zone": "a"}).status_code == 201


def test_shapes_a_node_may_come_back_in_or_be_added_in_are_accepted(bob):
    Node.objects.filter(name="a1").update(state=NodeState.DRAINING)
    assert post(bob, gpus=4, gpu_sku="A100-40GB").status_code == 201
    sku = GpuSku.objects.create(name="L4-24GB")
    assert post(bob, gpus=2, gpu_sku=sku.name).status_code == 400
    AutoscalePolicy.objects.create(sku=sku, mode=AutoscaleMode.REACTIVE, gpus_per_node=2)
    assert post(bob, gpus=2, gpu_sku=sku.name).status_code == 201
    assert post(bob, gpus=3, gpu_sku=sku.name).status_code == 400


def test_nothing_is_refused_before_any_node_is_known():
    assert fit.why_never([], gpus=64, sku=None, selector={"x": "y"}) is None
    shapes = [fit.Shape("H100", 8, NodeState.DRAINING)]
    assert fit.only_unready(shapes, gpus=8, sku="H100", selector={}) == "draining"
    assert fit.only_unready(shapes + [fit.Shape("H100", 8, "ready")], gpus=8, sku=None,
                            selector={}) is None  # fmt: skip


def test_kept_shapes_answer_a_submit_without_a_statement(db, django_assert_num_queries):
    fit.forget()
    fit.check({"gpus": 1})  # nothing known: the nodes and the pools are read once, and kept
    with django_assert_num_queries(0):
        fit.check({"gpus": 1})
    make_node("k1", "A100-40GB", 4)
    fit.forget()
    fit.check({"gpus": 4})
    with django_assert_num_queries(0):
        fit.check({"gpus": 2, "gpu_sku": "A100-40GB"})
    fit.forget()


def test_a_node_registered_after_the_shapes_were_kept_is_never_refused_against(db):
    fit.forget()
    make_node("k1", "A100-40GB", 4)
    fit.check({"gpus": 4})  # kept: one 4-GPU node
    make_node("k2", "H100-80GB", 8)  # registered since, in another process say (no forget)
    fit.check({"gpus": 8, "gpu_sku": "H100-80GB"})  # the kept shapes say never: read afresh
    with pytest.raises(ValidationError):
        fit.check({"gpus": 9})
    fit.forget()
