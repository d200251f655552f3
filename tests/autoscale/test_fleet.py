"""The autoscaler's view of a SKU's nodes from the database (apps/scheduling/autoscaling.fleet)."""

from django.utils import timezone

from apps.jobs import services
from apps.nodes.models import GpuSku
from apps.scheduling.autoscaling import fleet
from apps.scheduling.models import AutoscalePolicy
from tests.factories import make_node
from tests.unit.test_dispatcher import cast, placed_and_started  # noqa: F401 (fixture)


def test_a_node_that_ran_something_is_not_never_used(cast):  # noqa: F811
    make_node("h1", gpus=1)
    _job, attempt = placed_and_started(cast)
    services.attempt_member_finished(
        attempt_id=attempt.pk, rank=0, token=str(attempt.token), exit_code=0
    )
    make_node("h2", gpus=1)  # arrived after, ran nothing
    policy = AutoscalePolicy.objects.create(
        sku=GpuSku.objects.get(name="H100-80GB"), mode="reactive"
    )
    nodes = {n.name: n for n in fleet(policy, timezone.now())}
    assert nodes["h1"].idle_since is not None and not nodes["h1"].never_used
    assert nodes["h2"].idle_since is not None and nodes["h2"].never_used


def test_a_busy_node_is_neither_idle_nor_never_used(cast):  # noqa: F811
    make_node("h1", gpus=1)
    placed_and_started(cast)
    policy = AutoscalePolicy.objects.create(
        sku=GpuSku.objects.get(name="H100-80GB"), mode="reactive"
    )
    [node] = fleet(policy, timezone.now())
    assert node.idle_since is None and not node.never_used
