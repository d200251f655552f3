"""`GET /api/v1/templates/`: the job templates a submit may name (`"template"`), each with what
it does and its parameters (type, bounds, default); `GET /api/v1/templates/{name}/` for one."""

from rest_framework import serializers, viewsets

from apps.jobs.models import JobTemplate


class TemplateSerializer(serializers.ModelSerializer):
    params = serializers.JSONField(
        source="params_schema",
        help_text="its parameters: each name with its type, bounds and default",
    )

    class Meta:
        model = JobTemplate
        fields = ["name", "description", "params", "checkpointable", "cacheable",
                  "default_max_runtime_seconds"]  # fmt: skip


class TemplateViewSet(viewsets.ReadOnlyModelViewSet):
    """Any signed-in caller: templates are the platform's, the same for every tenant."""

    serializer_class = TemplateSerializer
    queryset = JobTemplate.objects.order_by("name")
    lookup_field = "name"
    pagination_class = None  # a handful, and a client wants them all
    filterset_class = None
