"""The jobs API (`/api/v1/jobs/`): submit, list, detail, cancel, logs, artifacts."""

import django_filters
import orjson
from django.core.files.storage import default_storage
from django.db.models import Prefetch
from django.http import FileResponse, Http404, HttpResponse
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, PolymorphicProxySerializer, extend_schema
from rest_framework import mixins, status, viewsets
from rest_framework.decorators import action
from rest_framework.exceptions import NotFound, ParseError, PermissionDenied, ValidationError
from rest_framework.negotiation import BaseContentNegotiation
from rest_framework.pagination import PageNumberPagination
from rest_framework.renderers import JSONRenderer
from rest_framework.response import Response

from apps.admission import estimates
from apps.admission.submit import UNREAD, names_in, submit_job
from apps.jobs import arrays, artifact_types, services
from apps.jobs.access import can_cancel, visible_arrays, visible_jobs
from apps.jobs.lookup import (
    MIN_PREFIX,
    PrefixLookupMixin,
    prefix_range,
    resolve,
    whole_parent_ids,
)
from apps.jobs.models import AttemptMember, Job, JobArray, JobAttempt, JobState
from apps.jobs.serializers import (
    ArraySerializer,
    ArtifactSerializer,
    JobSerializer,
    JobSubmitSerializer,
    created_array_representation,
    created_representation,
    virtual_representation,
)
from apps.platform.agent_protocol import log_name
from apps.telemetry.read import METRICS_SCHEMA, job_metrics, log_notices
from apps.tenants.auth import PEEK_LIMIT, SubmitterAuthentication, TokenAuthentication


class AnyAccept(BaseContentNegotiation):
    """The first renderer whatever the client accepts (DRF's documented custom negotiation)."""

    def select_parser(self, request, parsers):
        return parsers[0]

    def select_renderer(self, request, renderers, format_suffix=None):
        return (renderers[0], renderers[0].media_type)


class JobFilter(django_filters.FilterSet):
    state = django_filters.ChoiceFilter(choices=JobState.choices)
    tier = django_filters.CharFilter(field_name="tier__name")

    class Meta:
        model = Job
        fields = ["state", "tier"]


def job_queryset(user):
    members = AttemptMember.objects.select_related("node")
    attempts = JobAttempt.objects.prefetch_related(Prefetch("members", queryset=members))
    return (
        visible_jobs(user)
        .select_related("tenant", "user", "tier", "gpu_sku", "template")
        .prefetch_related(Prefetch("attempts", queryset=attempts), "dependencies")
        .order_by("-created_at")
    )


def _small_json(request) -> bool:
    """A JSON body of at most PEEK_LIMIT bytes (a larger one, or another kind: parsed by the view)."""
    if request.META.get("CONTENT_TYPE", "").split(";")[0].strip() != "application/json":
        return False
    try:
        return int(request.META.get("CONTENT_LENGTH") or 0) <= PEEK_LIMIT
    except ValueError:
        return False


MAX_TASK_PAGE = 10_000
# A submit answers with the job, or with the array when it had `array` (docs/arrays.md).
SUBMITTED = PolymorphicProxySerializer(
    component_name="Submitted",
    serializers=[JobSerializer, ArraySerializer],
    resource_type_field_name=None,
)


def _positive(request, name: str, default: int, most: int | None) -> int:
    raw = request.query_params.get(name)
    if raw in (None, ""):
        return default
    try:
        value = int(raw)
    except ValueError:
        value = 0
    if value < 1 or (most is not None and value > most):
        raise ValidationError(
            {name: [f"must be a whole number from 1{f' to {most}' if most else ''}"]}
        )
    return value


def array_for(user, raw, *, field: str = "id") -> JobArray:
    """The array the user may see that `raw` names (its id, or a unique prefix of at least
    MIN_PREFIX characters), else 404 (another tenant's too); an ambiguous prefix is a 400 naming
    `field`, and so is a malformed id outside the path (`?array=`)."""
    arrays = visible_arrays(user)
    if field != "id" and (
        prefix_range(raw) is None or len(str(raw).strip().replace("-", "")) < MIN_PREFIX
    ):
        raise ValidationError(
            {field: [f"must be a job array's id, or a unique prefix of it of at least {MIN_PREFIX} characters"]}
        )  # fmt: skip
    pk = resolve(arrays, raw, what="job array", field=field)
    array = arrays.select_related("tenant", "user", "tier").filter(pk=pk).first()
    if array is None:
        raise NotFound("no such job array")
    return array


def _whole(request, name: str, *, default, least: int):
    """A query parameter that must be a whole number from `least` (a 400 naming it otherwise)."""
    raw = request.query_params.get(name)
    if raw in (None, ""):
        return default
    if not (raw.isascii() and raw.isdigit() and len(raw) < 10) or int(raw) < least:
        raise ValidationError({name: [f"must be a whole number from {least}"]})
    return int(raw)


def log_names(job: Job, rank: int = 0) -> list[str]:
    """Where each attempt's log of that member is stored (apps/platform/agent_protocol.py)."""
    return [log_name(str(job.pk), n, rank) for n in range(1, job.attempts_count + 1)]


class TaskListRenderer(JSONRenderer):
    """JSON through orjson: a page of an array's tasks is up to 10,000 task objects, whose
    encoding was most of the listing's time with the standard library's encoder."""

    def render(self, data, accepted_media_type=None, renderer_context=None) -> bytes:
        if data is None:
            return b""
        try:
            return orjson.dumps(data)
        except TypeError:  # a value orjson does not know (a lazy translation): DRF's encoder
            return super().render(data, accepted_media_type, renderer_context)


MAX_JOB_PAGE = 1_000


class JobPages(PageNumberPagination):
    """`?page_size=N` (1 to MAX_JOB_PAGE, default 50), as the array task listing takes it; a bad
    one is a 400 naming `page_size` (DRF's own would fall back to the default without a word).
    `?page_size=1` is the cheap way to read a count."""

    page_size_query_param = "page_size"

    def get_page_size(self, request):
        return _positive(request, "page_size", self.page_size or 50, MAX_JOB_PAGE)


class JobViewSet(
    PrefixLookupMixin,
    mixins.ListModelMixin,
    mixins.RetrieveModelMixin,
    viewsets.GenericViewSet,
):
    """`{id}` in each path is a job's id, or a unique prefix of it (apps/jobs/lookup.py)."""

    id_noun = "job"
    serializer_class = JobSerializer
    filterset_class = JobFilter
    pagination_class = JobPages

    def get_renderers(self):
        """`?array=` listings render with orjson (same JSON, same negotiation as the others)."""
        renderers = super().get_renderers()
        request = getattr(self, "request", None)
        if (
            request is not None
            and "array" in request.GET
            and getattr(self, "action", None) == "list"
        ):
            return [TaskListRenderer() if type(r) is JSONRenderer else r for r in renderers]
        return renderers

    def get_content_negotiator(self):
        """A download answers any Accept (its file's own type: apps/jobs/artifact_types.py), its
        refusals in JSON as elsewhere; the other actions negotiate JSON."""
        if getattr(self, "action", None) == "artifact":  # unset on the submit's early path
            return AnyAccept()
        return super().get_content_negotiator()

    def get_queryset(self):
        if getattr(
            self, "swagger_fake_view", False
        ):  # the OpenAPI document's generation: no caller
            return Job.objects.none()
        return job_queryset(self.request.user)

    def get_authenticators(self):
        """A submit's token lookup also reads its submitter (apps/tenants/auth.py)."""
        authenticators = super().get_authenticators()
        request = getattr(self, "request", None)  # none where the schema is generated
        if (
            request is None
            or getattr(self, "swagger_fake_view", False)
            or getattr(self, "action_map", {}).get(request.method.lower()) != "create"
        ):
            return authenticators
        return [
            SubmitterAuthentication() if type(a) is TokenAuthentication else a
            for a in authenticators
        ]

    def get_serializer(self, *args, **kwargs):
        """A list page counts the queue positions of its queued jobs in one query, however long
        the queue (apps/scheduling/dispatcher.py queue_positions)."""
        if getattr(self, "action", None) == "list" and args and "context" not in kwargs:
            from apps.scheduling.dispatcher import queue_positions

            context = self.get_serializer_context()
            context["queue_positions"] = queue_positions(list(args[0]))
            kwargs["context"] = context
        return super().get_serializer(*args, **kwargs)

    def perform_authentication(self, request):
        """A submit's small JSON body is parsed first (DRF's own parsing, which the view would do
        next anyway), so that the token's lookup also reads the template and SKU it names
        (apps/tenants/auth.py). A parse error is kept for the view, whose answer it was: after
        the 401 and the permission checks, as without the read-ahead."""
        self.parse_error = None
        if getattr(self, "action", None) == "create" and _small_json(request):
            try:
                names = names_in(request.data)
            except ParseError as error:
                names, self.parse_error = {}, error
            for authenticator in request.authenticators:
                if isinstance(authenticator, SubmitterAuthentication):
                    authenticator.names = names
        super().perform_authentication(request)

    @extend_schema(
        parameters=[
            OpenApiParameter(
                "array",
                OpenApiTypes.UUID,
                description="A job array's tasks, in index "
                "order, the ones not yet queued as jobs included (docs/arrays.md)",
            ),
            OpenApiParameter(
                "page_size",
                OpenApiTypes.INT,
                description=f"Jobs a page (1..{MAX_JOB_PAGE}, default 50); with `array`, tasks a "
                f"page (1..{MAX_TASK_PAGE})",
            ),
        ]  # fmt: skip
    )
    def list(self, request, *args, **kwargs):
        if "array" not in request.query_params:
            return super().list(request, *args, **kwargs)
        return self._array_tasks(request)

    def _array_tasks(self, request):
        """`?array=<id>`: every task of the array, rows and virtual ones (apps/jobs/arrays.py)."""
        array = array_for(request.user, request.query_params["array"], field="array")
        state = request.query_params.get("state") or None
        if state is not None and state not in JobState.values:
            raise ValidationError({"state": [f"must be one of {', '.join(JobState.values)}"]})
        page, size = (
            _positive(request, "page", 1, None),
            _positive(request, "page_size", 50, MAX_TASK_PAGE),
        )
        total, tasks = arrays.tasks(array, state=state, offset=(page - 1) * size, limit=size)
        if page > 1 and not tasks:
            raise NotFound("Invalid page.")
        rows = [t for t in tasks if isinstance(t, Job)]
        # The rows' context (queue positions: a read of the queue) and attempts only for a page
        # that has rows: a page of virtual tasks reads nothing more.
        context = self.get_serializer_context() if rows else {}
        full = (
            {j.pk: j for j in self.get_queryset().filter(pk__in=[j.pk for j in rows])}
            if rows
            else {}
        )
        results = [
            JobSerializer(full.get(t.pk, t), context=context).data if isinstance(t, Job)
            else virtual_representation(t)
            for t in tasks
        ]  # fmt: skip

        def link(number: int) -> str | None:
            if number < 1 or (number - 1) * size >= total:
                return None
            query = request.query_params.copy()
            query["page"] = str(number)
            return request.build_absolute_uri(f"{request.path}?{query.urlencode()}")

        return Response({"count": total, "next": link(page + 1), "previous": link(page - 1) if page > 1 else None,
                         "results": results})  # fmt: skip

    @extend_schema(request=JobSubmitSerializer, responses={201: SUBMITTED, 200: SUBMITTED})
    def create(self, request):
        """Through apps/admission/submit.py `submit_job` (docs/admission.md), as the web form.
        A submit with `array` answers with the array (ArraySerializer) instead."""
        submitted = submit_job(
            user=request.user, body=self._body, idempotency_key=request.headers.get("Idempotency-Key"),
            membership=getattr(request.auth, "submitter", UNREAD),  # read with the token (get_authenticators)
            headers=self.headers,  # X-RateLimit-* on every answer, refusals too
        )  # fmt: skip
        if submitted.array is not None:
            array = submitted.array
            if submitted.created and not array.has_dependencies:
                # Every task queued: nothing to count, and the serializer built once.
                return Response(created_array_representation(array), status=status.HTTP_201_CREATED)
            return Response(
                ArraySerializer(array).data,
                status=status.HTTP_201_CREATED if submitted.created else status.HTTP_200_OK,
            )
        job = submitted.job
        if submitted.created:
            # The job as created, with the objects in hand and no attempts yet: nothing is read
            # back (tests/admission/test_submit_queries.py); its queue position and start
            # estimate come from apps.admission.estimates.for_new_job.
            position, start = estimates.for_new_job(job)
            return Response(
                created_representation(job, position=position, start=start),
                status=status.HTTP_201_CREATED,
            )
        return Response(
            JobSerializer(job_queryset(request.user).get(pk=job.pk)).data, status=status.HTTP_200_OK
        )

    def _body(self):
        if self.parse_error is not None:
            raise self.parse_error
        body = self.request.data
        if type(body) is not dict or not body.get("depends_on"):
            return body  # no parent to look up: no querysets built (a tenth of a submit's CPU)
        user = self.request.user  # `depends_on` may name parents by id prefix (lookup.py)
        return whole_parent_ids(body, jobs=visible_jobs(user), arrays=visible_arrays(user))

    @extend_schema(request=None, responses={200: JobSerializer})
    @action(detail=True, methods=["post"])
    def cancel(self, request, pk=None):
        job = self.get_object()
        if not can_cancel(request.user, job):
            raise PermissionDenied("you may not cancel this job")
        services.job_cancel(job=job, actor=f"user:{request.user.username}")
        return Response(JobSerializer(self.get_queryset().get(pk=job.pk)).data)

    @extend_schema(
        parameters=[
            OpenApiParameter(
                "rank",
                OpenApiTypes.INT,
                description="A gang member's log (default 0, "
                "the leader); 404 for a rank the job does not have",
            ),
            OpenApiParameter(
                "attempt",
                OpenApiTypes.INT,
                description="One attempt's log, without "
                "the `=== attempt N ===` line (default: every attempt's, each after one)",
            ),
        ],  # fmt: skip
        responses={(200, "text/plain"): str},
    )
    @action(detail=True, methods=["get"])
    def logs(self, request, pk=None):
        job = self.get_object()
        rank = _whole(request, "rank", default=0, least=0)
        attempt = _whole(request, "attempt", default=None, least=1)
        if rank >= job.nodes:
            raise NotFound(f"the job has no rank {rank}: its ranks are 0 to {job.nodes - 1}")
        if attempt is not None and attempt > job.attempts_count:
            raise NotFound(f"the job has no attempt {attempt}")
        chunks, notices = [], log_notices(job)  # GPU notices (apps/telemetry) after each attempt
        for number, name in enumerate(log_names(job, rank), start=1):
            if attempt is not None and number != attempt:
                continue
            if default_storage.exists(name):
                with default_storage.open(name, "rb") as handle:
                    head = b"" if attempt is not None else f"=== attempt {number} ===\n".encode()
                    chunks.append(head + handle.read())
            chunks.append(notices.get(number, b""))
        return HttpResponse(b"".join(chunks), content_type="text/plain; charset=utf-8")

    @extend_schema(responses={200: ArtifactSerializer(many=True)})
    @action(
        detail=True, methods=["get"], pagination_class=None, filterset_class=None
    )  # a plain list
    def artifacts(self, request, pk=None):
        job = self.get_object()
        return Response(ArtifactSerializer(job.artifacts.all(), many=True).data)

    @extend_schema(responses={200: METRICS_SCHEMA})
    @action(detail=True, methods=["get"], pagination_class=None, filterset_class=None)
    def metrics(self, request, pk=None):
        """The job's GPU telemetry: its GPUs, samples and summary (docs/telemetry.md)."""
        return Response(job_metrics(self.get_object()))

    @extend_schema(
        responses={
            (200, media): OpenApiTypes.ANY if media == "application/json" else OpenApiTypes.BINARY
            for media in artifact_types.MEDIA_TYPES
        },
        description="Download one artifact, as an attachment. Its Content-Type comes from its "
        "name's suffix (apps/jobs/artifact_types.py); any other name is application/octet-stream.",
    )
    def artifact(self, request, pk=None, name=None):
        # Routed in gpuplatform/urls.py: names carry no trailing slash.
        job = self.get_object()
        artifact = job.artifacts.filter(name=name).first()
        if artifact is None or not default_storage.exists(artifact.file.name):
            raise Http404("no such artifact")
        return FileResponse(
            default_storage.open(artifact.file.name, "rb"),
            as_attachment=True,
            filename=artifact.name.rsplit("/", 1)[-1],
            content_type=artifact_types.content_type(artifact.name),
        )


class ArrayViewSet(mixins.ListModelMixin, viewsets.GenericViewSet):
    """`/api/v1/arrays/`: the tenant's job arrays (submitted through `POST /api/v1/jobs/` with
    `array`), each with its counts by state; cancel-all and requeue-failed."""

    serializer_class = ArraySerializer
    lookup_value_regex = "[^/]+"

    def get_queryset(self):
        if getattr(self, "swagger_fake_view", False):
            return JobArray.objects.none()
        return (
            visible_arrays(self.request.user)
            .select_related("tenant", "user", "tier")
            .order_by("-created_at")
        )

    def retrieve(self, request, pk=None):
        return Response(ArraySerializer(array_for(request.user, pk)).data)

    def _changeable(self, request, pk) -> JobArray:
        array = array_for(request.user, pk)
        if not can_cancel(request.user, array):
            raise PermissionDenied("you may not change this job array")
        return array

    @extend_schema(request=None, responses={200: ArraySerializer})
    @action(detail=True, methods=["post"])
    def cancel(self, request, pk=None):
        """Every task ends cancelled: the queued ones at once, running ones are told to stop (as a
        job's cancel: their GPUs are freed when the agent reports them gone)."""
        array = self._changeable(request, pk)
        arrays.array_cancel(array=array, actor=f"user:{request.user.username}")
        return Response(ArraySerializer(array).data)

    @extend_schema(request=None, responses={200: ArraySerializer})
    @action(detail=True, methods=["post"], url_path="requeue-failed")
    def requeue_failed(self, request, pk=None):
        """Failed tasks back to the queue, each with a new attempt to come."""
        array = self._changeable(request, pk)
        arrays.requeue_failed(array=array, actor=f"user:{request.user.username}")
        return Response(ArraySerializer(array).data)
