"""`/api/v1/nodes/` (staff): nodes, their GPUs, what holds each GPU, health."""

from django.db.models import Prefetch
from rest_framework import serializers, viewsets
from rest_framework.permissions import IsAdminUser

from apps.jobs.models import GpuAllocation
from apps.nodes.models import Gpu, Node, NodeState


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
