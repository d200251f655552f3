"""`/api/v1/secrets/`: the caller's tenant's secrets. Values are write-only: every answer is
`{"name", "created_at", "updated_at"}` (docs/secrets.md).

- GET (list, one by name): every member of the tenant (admin, member, viewer): names and dates.
- POST (create), PUT `{name}/` (replace the value), DELETE `{name}/`: tenant admins only (403).
- Another tenant's secret is not found (404), as an unknown name is.
"""

from django.utils.functional import cached_property
from django.views.decorators.debug import sensitive_variables
from drf_spectacular.utils import extend_schema, extend_schema_field
from rest_framework import serializers, status, viewsets
from rest_framework.exceptions import NotFound, PermissionDenied
from rest_framework.parsers import JSONParser
from rest_framework.response import Response

from apps.jobs.access import membership_of
from apps.secrets.models import NAME_MAX, NAME_PATTERN, Secret
from apps.secrets.services import (
    MAX_VALUE_BYTES,
    SecretError,
    name_problem,
    secret_create,
    secret_delete,
    secret_replace,
    tenant_secrets,
    value_problem,
)
from apps.tenants.models import Membership, Role

NAME_SCHEMA = {"type": "string", "pattern": NAME_PATTERN, "minLength": 1, "maxLength": NAME_MAX,
               "description": "an environment variable name, unique in the tenant"}  # fmt: skip
VALUE_SCHEMA = {
    "type": "string",
    "writeOnly": True,
    "maxLength": MAX_VALUE_BYTES,
    "description": f"write-only: never returned. At most {MAX_VALUE_BYTES} bytes of UTF-8, no NUL.",
}


@extend_schema_field(NAME_SCHEMA)
class NameField(serializers.Field):
    def to_internal_value(self, data):
        problem = name_problem(data)
        if problem:
            raise serializers.ValidationError(problem)
        return data

    def to_representation(self, value):
        return value


@extend_schema_field(VALUE_SCHEMA)
class ValueField(serializers.Field):
    def __init__(self, **kwargs):
        kwargs["write_only"] = True
        super().__init__(**kwargs)

    @sensitive_variables()
    def to_internal_value(self, data):
        problem = value_problem(data)
        if problem:
            raise serializers.ValidationError(problem)
        return data

    def to_representation(self, value):  # never called: write-only
        raise AssertionError("a secret's value is never represented")


class StrictBody(serializers.Serializer):
    """A JSON object with only the declared fields (an unknown one is 400 naming it)."""

    def to_internal_value(self, data):
        if not isinstance(data, dict):
            raise serializers.ValidationError({"body": ["must be a JSON object"]})
        unknown = sorted(set(data) - set(self.fields))
        if unknown:
            raise serializers.ValidationError({name: ["unknown field"] for name in unknown})
        return super().to_internal_value(data)


class SecretCreateSerializer(StrictBody):
    """A new secret: its name and value (the value is never returned)."""

    name = NameField()
    value = ValueField()


class SecretReplaceSerializer(StrictBody):
    """A secret's new value (never returned); a name, if given, must be the path's."""

    name = NameField(required=False, help_text="if given, the name in the path")
    value = ValueField()


class SecretSerializer(serializers.ModelSerializer):
    """All that is ever shown of a secret."""

    class Meta:
        model = Secret
        fields = ["name", "created_at", "updated_at"]


class SecretViewSet(viewsets.GenericViewSet):
    serializer_class = SecretSerializer
    lookup_field = "name"
    filter_backends: list = []
    parser_classes = [JSONParser]  # JSON bodies only (415 otherwise)

    @cached_property
    def membership(self) -> Membership:
        membership = membership_of(self.request.user)
        if membership is None:
            raise PermissionDenied("you belong to no tenant")
        return membership

    def get_queryset(self):
        if getattr(self, "swagger_fake_view", False):  # the OpenAPI document's generation
            return Secret.objects.none()
        return tenant_secrets(self.membership.tenant)

    def initial(self, request, *args, **kwargs):
        super().initial(request, *args, **kwargs)
        self.membership  # noqa: B018 (403 for a user of no tenant, before anything else)
        if request.method not in ("GET", "HEAD", "OPTIONS") and self.membership.role != Role.ADMIN:
            raise PermissionDenied("only tenant admins may create, replace or delete secrets")

    def get_object(self) -> Secret:
        secret = self.get_queryset().filter(name=self.kwargs["name"]).first()
        if secret is None:
            raise NotFound("no such secret")
        return secret

    @sensitive_variables()
    def _valid(self, serializer_class, data) -> dict:
        serializer = serializer_class(data=data)
        serializer.is_valid(raise_exception=True)
        return serializer.validated_data

    def list(self, request):
        page = self.paginate_queryset(self.get_queryset())
        return self.get_paginated_response(SecretSerializer(page, many=True).data)

    def retrieve(self, request, name=None):
        return Response(SecretSerializer(self.get_object()).data)

    @extend_schema(request=SecretCreateSerializer, responses={201: SecretSerializer})
    @sensitive_variables()
    def create(self, request):
        data = self._valid(SecretCreateSerializer, request.data)
        try:
            secret = secret_create(tenant=self.membership.tenant, name=data["name"],
                                   value=data["value"], user=request.user)  # fmt: skip
        except SecretError as error:
            raise serializers.ValidationError({error.field: [error.message]}) from None
        return Response(SecretSerializer(secret).data, status=status.HTTP_201_CREATED)

    @extend_schema(request=SecretReplaceSerializer, responses={200: SecretSerializer})
    @sensitive_variables()
    def update(self, request, name=None):
        secret = self.get_object()
        data = self._valid(SecretReplaceSerializer, request.data)
        if data.get("name", secret.name) != secret.name:
            raise serializers.ValidationError(
                {"name": [f"the path names {secret.name}: a secret is not renamed"]}
            )
        try:
            secret = secret_replace(secret=secret, value=data["value"], user=request.user)
        except SecretError as error:
            raise serializers.ValidationError({error.field: [error.message]}) from None
        return Response(SecretSerializer(secret).data)

    @extend_schema(responses={204: None})
    def destroy(self, request, name=None):
        secret_delete(secret=self.get_object(), user=request.user)
        return Response(status=status.HTTP_204_NO_CONTENT)
