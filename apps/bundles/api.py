"""The bundles API (`/api/v1/bundles/`): upload a working directory's archive, ask whether one is
there, list, read and delete a tenant's bundles (docs/own-code.md, "Bundles").

`POST` takes the archive itself as the body (`Content-Type: application/gzip` or
`application/zip`), read in chunks from the request's stream: never `request.data` or
`request.body`, which would hold it whole in memory. A bundle is its tenant's: another tenant's
digest answers 404 exactly as one nobody uploaded.
"""

from __future__ import annotations

from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiResponse, extend_schema
from rest_framework import mixins, serializers, status, viewsets
from rest_framework.exceptions import PermissionDenied
from rest_framework.parsers import BaseParser
from rest_framework.response import Response

from apps.bundles import services
from apps.bundles.models import Bundle
from apps.jobs.access import membership_of
from apps.tenants.models import Role


class BundleSerializer(serializers.ModelSerializer):
    content_type = serializers.SerializerMethodField()

    class Meta:
        model = Bundle
        fields = ["sha256", "size", "content_type", "created_at", "last_used_at"]

    def get_content_type(self, bundle: Bundle) -> str:
        return bundle.media_type


class ArchiveParser(BaseParser):
    """Declares the archive media types (for content negotiation and the OpenAPI document).
    The view reads the stream itself; this parser is never asked to parse."""

    media_type = "application/gzip"

    def parse(self, stream, media_type=None, parser_context=None):  # pragma: no cover
        return stream


class ZipParser(ArchiveParser):
    media_type = "application/zip"


ARCHIVE = {"application/gzip": OpenApiTypes.BINARY, "application/zip": OpenApiTypes.BINARY}
UPLOADED = OpenApiResponse(BundleSerializer, description="Stored: a new bundle of the tenant.")
KNOWN = OpenApiResponse(BundleSerializer, description="The tenant had it already: nothing stored.")


def _content_length(request) -> int | None:
    try:
        return int(request.META.get("CONTENT_LENGTH") or "")
    except ValueError:
        return None


def _body(django_request):
    """What to read the body from, in chunks: Django's request (it reads CONTENT_LENGTH bytes),
    or for a chunked body under a WSGI server that ends the input itself (gunicorn's
    `wsgi.input_terminated`, no CONTENT_LENGTH) that input, to its end. The ASGI bridge gives a
    chunked body its CONTENT_LENGTH (gpuplatform/asgi.py)."""
    meta = django_request.META
    if not meta.get("CONTENT_LENGTH") and meta.get("wsgi.input_terminated"):
        return meta["wsgi.input"]
    return django_request


class BundleViewSet(
    mixins.ListModelMixin,
    mixins.RetrieveModelMixin,
    mixins.DestroyModelMixin,
    viewsets.GenericViewSet,
):
    serializer_class = BundleSerializer
    lookup_field = "sha256"
    lookup_value_regex = "[0-9a-f]{64}"
    parser_classes = [ArchiveParser, ZipParser]
    filterset_class = None
    filter_backends: list = []

    def get_queryset(self):
        if getattr(self, "swagger_fake_view", False):  # the OpenAPI document's generation
            return Bundle.objects.none()
        membership = membership_of(self.request.user)
        if membership is None:  # staff without a tenant included: bundles are tenants' own
            return Bundle.objects.none()
        return Bundle.objects.filter(tenant_id=membership.tenant_id).order_by("-created_at")

    def _writer(self, verb: str):
        membership = membership_of(self.request.user)
        if membership is None:
            raise PermissionDenied("you belong to no tenant")
        if membership.role not in (Role.ADMIN, Role.MEMBER):
            raise PermissionDenied(f"role {membership.role} may not {verb} bundles")
        return membership

    @extend_schema(
        request=ARCHIVE,
        responses={201: UPLOADED, 200: KNOWN},
        description="The archive (.tar.gz or .zip) as the raw body, at most the tenant's bundle "
        "cap (413 names the cap and the size).",
    )
    def create(self, request):
        membership = self._writer("upload")
        stream = _body(request._request)
        try:
            stored = services.store(
                tenant=membership.tenant, user=request.user, source=stream,
                content_type=request.META.get("CONTENT_TYPE", ""), length=_content_length(request),
            )  # fmt: skip
        except services.BundleRefused as refused:
            return Response({refused.field: [refused.message]}, status=refused.status)
        return Response(
            BundleSerializer(stored.bundle).data,
            status=status.HTTP_201_CREATED if stored.created else status.HTTP_200_OK,
        )

    def get_object(self):
        bundle = super().get_object()
        return services.touch(bundle.tenant_id, bundle.sha256) or bundle

    @extend_schema(
        responses={
            204: None,
            409: OpenApiResponse(
                {
                    "type": "object",
                    "additionalProperties": {"type": "array", "items": {"type": "string"}},
                },
                description="A queued or running job uses it (the message under `bundle`).",
            ),
        }
    )
    def destroy(self, request, sha256=None):
        self._writer("delete")
        bundle = super().get_object()
        try:
            services.delete(bundle)
        except services.BundleInUse:
            return Response(
                {"bundle": [f"bundle {bundle.sha256} is used by a queued or running job"]},
                status=status.HTTP_409_CONFLICT,
            )
        return Response(status=status.HTTP_204_NO_CONTENT)

    def retrieve(self, request, sha256=None):
        """The bundle's metadata; HEAD too: 200, or 404 for a digest this tenant has not
        uploaded (another tenant's included). Either touches it (retention counts from here)."""
        return super().retrieve(request, sha256=sha256)
