"""The jobs API (`/api/v1/jobs/`): submit, list, detail, cancel, logs, artifacts."""

import django_filters
from django.core.files.storage import default_storage
from django.db.models import Prefetch
from django.http import FileResponse, Http404, HttpResponse
from drf_spectacular.utils import extend_schema
from rest_framework import mixins, status, viewsets
from rest_framework.decorators import action
from rest_framework.exceptions import ParseError, PermissionDenied
from rest_framework.response import Response

from apps.admission import estimates
from apps.admission.submit import UNREAD, names_in, submit_job
from apps.jobs import services
from apps.jobs.access import can_cancel, visible_jobs
from apps.jobs.models import AttemptMember, Job, JobAttempt, JobState
from apps.jobs.serializers import (
    ArtifactSerializer,
    JobSerializer,
    JobSubmitSerializer,
    created_representation,
)
from apps.tenants.auth import PEEK_LIMIT, SubmitterAuthentication, TokenAuthentication


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
        .prefetch_related(Prefetch("attempts", queryset=attempts))
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


def log_names(job: Job) -> list[str]:
    return [f"logs/{job.pk}/attempt-{n}.log" for n in range(1, job.attempts_count + 1)]


class JobViewSet(mixins.ListModelMixin, mixins.RetrieveModelMixin, viewsets.GenericViewSet):
    serializer_class = JobSerializer
    filterset_class = JobFilter

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

    @extend_schema(request=JobSubmitSerializer, responses={201: JobSerializer})
    def create(self, request):
        """Through apps/admission/submit.py `submit_job` (docs/admission.md), as the web form."""
        submitted = submit_job(
            user=request.user, body=self._body, idempotency_key=request.headers.get("Idempotency-Key"),
            membership=getattr(request.auth, "submitter", UNREAD),  # read with the token (get_authenticators)
            headers=self.headers,  # X-RateLimit-* on every answer, refusals too
        )  # fmt: skip
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
        return self.request.data

    @extend_schema(request=None, responses={200: JobSerializer})
    @action(detail=True, methods=["post"])
    def cancel(self, request, pk=None):
        job = self.get_object()
        if not can_cancel(request.user, job):
            raise PermissionDenied("you may not cancel this job")
        services.job_cancel(job=job, actor=f"user:{request.user.username}")
        return Response(JobSerializer(self.get_queryset().get(pk=job.pk)).data)

    @extend_schema(responses={(200, "text/plain"): str})
    @action(detail=True, methods=["get"])
    def logs(self, request, pk=None):
        job = self.get_object()
        chunks = []
        for number, name in enumerate(log_names(job), start=1):
            if default_storage.exists(name):
                with default_storage.open(name, "rb") as handle:
                    chunks.append(f"=== attempt {number} ===\n".encode() + handle.read())
        return HttpResponse(b"".join(chunks), content_type="text/plain; charset=utf-8")

    @extend_schema(responses={200: ArtifactSerializer(many=True)})
    @action(
        detail=True, methods=["get"], pagination_class=None, filterset_class=None
    )  # a plain list
    def artifacts(self, request, pk=None):
        job = self.get_object()
        return Response(ArtifactSerializer(job.artifacts.all(), many=True).data)

    @extend_schema(responses={(200, "application/octet-stream"): bytes})
    def artifact(self, request, pk=None, name=None):
        """Download one artifact (routed in gpuplatform/urls.py: names carry no trailing slash)."""
        job = self.get_object()
        artifact = job.artifacts.filter(name=name).first()
        if artifact is None or not default_storage.exists(artifact.file.name):
            raise Http404("no such artifact")
        return FileResponse(
            default_storage.open(artifact.file.name, "rb"),
            as_attachment=True,
            filename=artifact.name.rsplit("/", 1)[-1],
        )
