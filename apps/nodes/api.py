"""`/api/v1/nodes/` (staff): nodes, their GPUs, what holds each GPU, health; `/api/v1/capacity/`
(anyone signed in): free GPUs per SKU, counts only."""

from django.db.models import Count, Exists, OuterRef, Prefetch, Q
from drf_spectacular.utils import extend_schema
from rest_framework import serializers, viewsets
from rest_framework.permissions import IsAdminUser
from rest_framework.response import Response
from rest_framework.views import APIView

from apps.jobs.models import GpuAllocation
from apps.nodes.models import Gpu, GpuHealth, Node, NodeState


class GpuSerializer(serializers.ModelSerializer):
    allocated_to = serializers.SerializerMethodField()

    class Meta:
        model = Gpu
        fields = [
            "index",
            "uuid",
            "memory_mib",
            "health",
            "utilization_percent",
            "memory_used_mib",
            "allocated_to",
        ]

    def get_allocated_to(self, gpu: Gpu) -> int | None:
        held = gpu.live_allocations  # type: ignore[attr-defined]  # prefetched (to_attr) by the view
        return held[0].attempt_id if held else None


class NodeSerializer(serializers.ModelSerializer):
    sku = serializers.CharField(source="sku.name")
    gpus = GpuSerializer(many=True)

    class Meta:
        model = Node
        fields = ["name", "sku", "state", "labels", "hostname", "isolation", "allow_unisolated_commands",
                  "last_heartbeat_at", "gpus"]  # fmt: skip


class NodeViewSet(viewsets.ReadOnlyModelViewSet):
    permission_classes = [IsAdminUser]
    serializer_class = NodeSerializer
    lookup_field = "name"

    def get_queryset(self):
        live = GpuAllocation.objects.filter(released_at=None)
        gpus = Gpu.objects.prefetch_related(
            Prefetch("allocations", queryset=live, to_attr="live_allocations")
        )
        nodes = Node.objects.select_related("sku").prefetch_related(Prefetch("gpus", queryset=gpus))
        return nodes.exclude(state=NodeState.TERMINATED)  # given back by the autoscaler


class SkuCapacitySerializer(serializers.Serializer):
    sku = serializers.CharField()
    nodes = serializers.IntegerField(help_text="ready nodes of this SKU")
    gpus = serializers.IntegerField(help_text="GPUs on those nodes")
    free = serializers.IntegerField(help_text="healthy GPUs that no job holds now")
    most_free_on_one_node = serializers.IntegerField(
        help_text="the most free GPUs on one node: the largest job of one node that could start now"
    )
    unavailable_nodes = serializers.IntegerField(help_text="cordoned, draining or lost nodes")


class CapacitySerializer(serializers.Serializer):
    skus = SkuCapacitySerializer(many=True)


class CapacityView(APIView):
    """`GET /api/v1/capacity/`: free GPUs per SKU, for any signed-in caller. Counts only: no
    node names, and nothing of whose jobs hold the GPUs (another tenant's work stays unseen)."""

    @extend_schema(responses={200: CapacitySerializer})
    def get(self, request):
        return Response({"skus": capacity()})


def capacity() -> list[dict]:
    live = GpuAllocation.objects.filter(gpu=OuterRef("pk"), released_at=None)
    per_node = (
        Gpu.objects.filter(node__state=NodeState.READY)
        .annotate(held=Exists(live))
        .values("node_id", "node__sku__name")
        .annotate(
            gpus=Count("id"), free=Count("id", filter=Q(held=False, health=GpuHealth.HEALTHY))
        )
        .order_by()
    )
    skus: dict[str, dict] = {}
    for row in per_node:
        sku = skus.setdefault(row["node__sku__name"], _empty(row["node__sku__name"]))
        sku["nodes"] += 1
        sku["gpus"] += row["gpus"]
        sku["free"] += row["free"]
        sku["most_free_on_one_node"] = max(sku["most_free_on_one_node"], row["free"])
    others = Node.objects.exclude(state__in=[NodeState.READY, NodeState.TERMINATED])
    for name in others.values_list("sku__name", flat=True):
        skus.setdefault(name, _empty(name))["unavailable_nodes"] += 1
    return [skus[name] for name in sorted(skus)]


def _empty(name: str) -> dict:
    return {"sku": name, "nodes": 0, "gpus": 0, "free": 0, "most_free_on_one_node": 0,
            "unavailable_nodes": 0}  # fmt: skip
