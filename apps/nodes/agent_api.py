"""The agent API (`/internal/agent/v1/`): the only way a node agent speaks to the control plane.

Authentication: `Authorization: Bearer <node credential>` (apps/nodes/credentials.py); a missing,
unknown, revoked or expired credential is 401 (a revoke reaches every web process within 2 s:
apps/nodes/credentials.py keeps each process's credentials as the token cache keeps tokens).
Authorisation, as Kubernetes' NodeRestriction: a credential acts as one node; it may register and
heartbeat only that node (registering another node's name is 403), and read or report on only the
attempt members placed on it, each request fenced by the attempt's token (`X-Attempt-Token`); any
other member, or a wrong token, is 404 as if it did not exist. docs/architecture.md, "Agent API".
"""

from __future__ import annotations

import dataclasses
import logging
import os
import tempfile
import uuid
from typing import cast

from django.conf import settings
from django.core.files import File
from django.core.files.storage import default_storage
from django.http import FileResponse
from django.views.decorators.debug import sensitive_variables
from rest_framework import serializers, status
from rest_framework.authentication import BaseAuthentication, get_authorization_header
from rest_framework.exceptions import (
    AuthenticationFailed,
    NotFound,
    PermissionDenied,
    ValidationError,
)
from rest_framework.permissions import BasePermission
from rest_framework.response import Response
from rest_framework.views import APIView

from apps.bundles.models import Bundle
from apps.jobs import checkpoints, dependencies
from apps.jobs import services as jobs
from apps.jobs.models import ATTEMPT_ACTIVE, AttemptMember
from apps.jobs.selectors import assignment_for, members_on, open_members_on
from apps.nodes.broker import node_broker_url
from apps.nodes.credentials import credential_node, message_key
from apps.nodes.services import NodeInfo, node_heartbeat, node_register
from apps.platform import agent_protocol as wire
from apps.scheduling.queues import START_ATTEMPT_TASK, STOP_ATTEMPT_TASK, node_queue
from apps.secrets.crypto import SecretUnreadable
from apps.secrets.services import secret_values
from apps.telemetry.ingest import ingest as ingest_gpu_samples

CHUNK = 1 << 20
log = logging.getLogger(__name__)


# --- authentication and authorisation ------------------------------------------------------------


class NodeIdentity:
    """`request.user` of an agent API request: the node its credential acts as."""

    is_authenticated = True
    is_active = True
    is_staff = False

    def __init__(self, node_name: str):
        self.node_name = node_name

    def __str__(self) -> str:
        return f"node:{self.node_name}"


class NodeCredentialAuthentication(BaseAuthentication):
    """`Authorization: Bearer gpn_...`, checked against this process's credential cache."""

    def authenticate(self, request):
        parts = get_authorization_header(request).split()
        if not parts or parts[0].lower() != wire.AUTH_SCHEME.lower().encode():
            return None
        if len(parts) != 2:
            raise AuthenticationFailed("Authorization wants 'Bearer <node credential>'.")
        node = credential_node(parts[1].decode(errors="replace"))
        if node is None:
            raise AuthenticationFailed("Unknown, revoked or expired node credential.")
        return NodeIdentity(node), None

    def authenticate_header(self, request) -> str:
        return f'{wire.AUTH_SCHEME} realm="gpuplatform-agent"'  # makes a refusal 401, not 403


class IsNode(BasePermission):
    def has_permission(self, request, view) -> bool:
        return isinstance(request.user, NodeIdentity)


class AgentView(APIView):
    authentication_classes = [NodeCredentialAuthentication]
    permission_classes = [IsNode]
    throttle_classes: list = []
    schema = None  # internal: not in the public API schema

    @property
    def node_name(self) -> str:
        return cast(NodeIdentity, self.request.user).node_name  # IsNode let only a node in

    def member(self, attempt_id: int, rank: int) -> AttemptMember:
        """The member if it is placed on this node and the request carries its attempt's token;
        anything else is 404, so a node learns nothing about members that are not its own."""
        header = self.request.headers.get(wire.ATTEMPT_TOKEN_HEADER, "")
        try:
            token = uuid.UUID(header)
        except ValueError:
            raise NotFound() from None
        member = (
            AttemptMember.objects.select_related(
                "attempt__job__template", "attempt__job__tier", "node"
            )
            .filter(
                attempt_id=attempt_id, rank=rank, node__name=self.node_name, attempt__token=token
            )
            .order_by()  # one row: none of the Meta orderings' joins (job, attempt)
            .first()
        )
        if member is None:
            raise NotFound()
        return member


def _validated(serializer_class, data) -> dict:
    serializer = serializer_class(data=data)
    serializer.is_valid(raise_exception=True)
    return serializer.validated_data


# --- node -----------------------------------------------------------------------------------------


class GpuSerializer(serializers.Serializer):
    index = serializers.IntegerField(min_value=0, max_value=63)
    uuid = serializers.CharField(max_length=80)
    memory_mib = serializers.IntegerField(min_value=0, default=0)
    healthy = serializers.BooleanField(default=True)
    utilization_percent = serializers.IntegerField(
        min_value=0, max_value=100, required=False, allow_null=True
    )
    memory_used_mib = serializers.IntegerField(min_value=0, required=False, allow_null=True)


def _gpus(data: list[dict]) -> list[wire.GpuInfo]:
    return [wire.GpuInfo(**item) for item in data]


class RegisterSerializer(serializers.Serializer):
    node = serializers.CharField(max_length=64)
    agent_instance = serializers.CharField(max_length=64)
    sku = serializers.CharField(max_length=64)
    hostname = serializers.CharField(max_length=255, allow_blank=True, default="")
    labels = serializers.DictField(
        child=serializers.CharField(max_length=200, allow_blank=True), default=dict
    )
    isolation = serializers.CharField(max_length=64, default="none")
    gpus = GpuSerializer(many=True)


class RegisterView(AgentView):
    def post(self, request):
        data = _validated(RegisterSerializer, request.data)
        if data["node"] != self.node_name:
            # 403, not 404: the node's own name is no secret to it, and the operator who gave an
            # agent the wrong credential needs to read why it cannot start.
            raise PermissionDenied(
                f"this credential is for node {self.node_name!r}, not {data['node']!r}"
            )
        info = NodeInfo(name=self.node_name, sku=data["sku"], gpus=_gpus(data["gpus"]), labels=data["labels"],
                        hostname=data["hostname"], isolation=data["isolation"])  # fmt: skip
        node_register(info=info, agent_instance=data["agent_instance"])
        key = message_key(node_name=self.node_name, agent_instance=data["agent_instance"])
        return Response({**agent_settings(self.node_name), "message_key": key.hex()})


def agent_settings(node_name: str) -> dict:
    """What an agent needs from the control plane besides its credential (it has no settings)."""
    return {
        "node": node_name,
        "queue": node_queue(node_name),
        "broker_url": node_broker_url(node_name),
        "start_task": START_ATTEMPT_TASK,
        "stop_task": STOP_ATTEMPT_TASK,
        "heartbeat_seconds": settings.HEARTBEAT_SECONDS,
        "gpu_sample_seconds": settings.GPU_SAMPLE_SECONDS,  # workers/telemetry.py
        "node_lost_after_heartbeats": settings.NODE_LOST_AFTER_HEARTBEATS,
        "kill_grace_seconds": settings.KILL_GRACE_SECONDS,
        "visibility_timeout": settings.CELERY_BROKER_TRANSPORT_OPTIONS.get(
            "visibility_timeout", 3600
        ),
        "log_max_bytes": settings.AGENT_LOG_MAX_BYTES,
        "artifact_max_bytes": settings.AGENT_ARTIFACT_MAX_BYTES,
        "checkpoint_max_bytes": settings.AGENT_CHECKPOINT_MAX_BYTES,
    }


class HeartbeatSerializer(serializers.Serializer):
    agent_instance = serializers.CharField(max_length=64)
    gpus = GpuSerializer(many=True, default=list)
    # The digest of the members list the agent holds (the last answer's `members_digest`):
    # when what is placed here has not changed since, the answer leaves the list out.
    members_digest = serializers.CharField(max_length=64, allow_blank=True, default="")


class HeartbeatView(AgentView):
    def post(self, request):
        data = _validated(HeartbeatSerializer, request.data)
        node = node_heartbeat(
            name=self.node_name, agent_instance=data["agent_instance"], gpus=_gpus(data["gpus"])
        )
        if node is None:
            return Response({"replaced": True, "members": []})
        ingest_gpu_samples(self.node_name, request.data.get("samples"))  # apps/telemetry
        # What runs here rides along, each with its resume point: the agent's sync (which
        # starts a member whose message is late) costs no second request. Unless it has not
        # changed since the agent's copy (one small query instead of the whole list).
        if data["members_digest"] and data["members_digest"] == _open_members_digest(
            self.node_name
        ):
            return Response({"replaced": False, "unchanged": True, "members": [],
                             "members_digest": data["members_digest"]})  # fmt: skip
        members = _open_members_wire(self.node_name)
        return Response(
            {"replaced": False, "members": members, "members_digest": wire.members_digest(members)}
        )


def _open_members_wire(node_name: str) -> list[dict]:
    members = list(open_members_on(node_name).values())
    resume = checkpoints.resume_checkpoints(
        [(a.attempt_id, a.job_id, a.attempt_number) for a in members]
    )
    return [wire.to_wire(dataclasses.replace(a, resume_from=resume[a.attempt_id])) for a in members]


def _open_members_digest(node_name: str) -> str:
    """wire.members_digest of what _open_members_wire would answer now, from the few fields it
    covers (what the agent's sync acts on: which members, their tokens, stops and activity)."""
    rows = (
        AttemptMember.objects.filter(node__name=node_name, ended_at=None)
        .order_by()  # the digest sorts: no ORDER BY (and its joins to attempt and job)
        .values_list(
            "attempt_id", "rank", "attempt__token", "attempt__stop_requested", "attempt__state"
        )
    )
    return wire.members_digest(
        [
            {
                "attempt_id": a,
                "rank": r,
                "token": str(t),
                "stop_requested": s,
                "active": state in ATTEMPT_ACTIVE,
            }
            for a, r, t, s, state in rows
        ]  # fmt: skip
    )


class AssignmentsView(AgentView):
    """GET: the members open on this node. `?attempts=1,2,3`: only those attempts' members on
    this node (open or not), each with its `resume_from`, so a start message naming several
    members costs the agent one request (the agent compares each token with the message's)."""

    def get(self, request):
        wanted = request.query_params.get("attempts")
        if wanted is None:
            return Response({"members": _open_members_wire(self.node_name)})
        try:
            ids = sorted({int(part) for part in wanted.split(",") if part.strip()})
        except ValueError:
            raise ValidationError({"attempts": ["comma-separated attempt ids"]}) from None
        if len(ids) > wire.MAX_REPORTS_PER_CALL:
            raise ValidationError(
                {"attempts": [f"at most {wire.MAX_REPORTS_PER_CALL} attempt ids"]}
            )
        found = members_on(self.node_name, ids)
        resume = checkpoints.resume_checkpoints(
            [(m.attempt_id, m.attempt.job_id, m.attempt.number) for m in found]
        )
        return Response({"members": [
            wire.to_wire(dataclasses.replace(assignment_for(m), resume_from=resume[m.attempt_id]))
            for m in found
        ]})  # fmt: skip


# --- one member -----------------------------------------------------------------------------------


class MemberView(AgentView):
    """The member's assignment: the agent checks every start or stop message against it."""

    def get(self, request, attempt_id: int, rank: int):
        member = self.member(attempt_id, rank)
        work = dataclasses.replace(
            assignment_for(member), resume_from=checkpoints.resume_checkpoint(member.attempt)
        )
        return Response(wire.to_wire(work))


class SecretsView(AgentView):
    """The values of the secrets the member's job names, for its agent to set in the job's
    environment at start: `{"secrets": {"NAME": "value"}}`, `Cache-Control: no-store`.

    Only for a live member (`_live(..., stopping=False)`: its attempt active and not told to
    stop, the member not ended) placed on this node with its attempt's token; anything else is
    404. A secret the job names that its tenant deleted after the submit is 410 `{"missing":
    [names], "detail": "secret X no longer exists"}`, and one no configured key decrypts is 409
    (`detail`): the agent fails the member with that reason and never runs it without its
    secrets (docs/secrets.md)."""

    @sensitive_variables()  # an error report shows none of its locals (the values)
    def get(self, request, attempt_id: int, rank: int):
        job = _live(self.member(attempt_id, rank), stopping=False).attempt.job
        names = [name for name in job.secrets or [] if isinstance(name, str)]
        try:
            values, missing = secret_values(tenant_id=job.tenant_id, names=names)
        except SecretUnreadable as error:
            response = Response({"detail": str(error)}, status=status.HTTP_409_CONFLICT)
        else:
            if missing:
                detail = "; ".join(f"secret {name} no longer exists" for name in missing)
                response = Response(
                    {"missing": missing, "detail": detail}, status=status.HTTP_410_GONE
                )
            else:
                response = Response({"secrets": values})
        response["Cache-Control"] = "no-store"
        return response


# --- files: log, artifacts, checkpoints -------------------------------------------------------------


class TooLarge(Exception):
    pass


def _content_length(request) -> int | None:
    try:
        return int(request.META.get("CONTENT_LENGTH") or "")
    except ValueError:
        return None


def _spool_body(request, limit: int):
    """The raw request body in a temporary file, read in chunks (never whole in memory); TooLarge
    past `limit` bytes, checked against Content-Length first and then against what arrives."""
    length = _content_length(request)
    if length is not None and length > limit:
        raise TooLarge
    spool = tempfile.SpooledTemporaryFile(max_size=8 * CHUNK)  # noqa: SIM115 (returned open)
    size = 0
    stream = request.stream  # DRF's documented stream of the body (None when it is empty)
    while stream is not None and (chunk := stream.read(CHUNK)):
        size += len(chunk)
        if size > limit:
            spool.close()
            raise TooLarge
        spool.write(chunk)
    spool.seek(0)
    return spool


def _too_large(what: str, limit: int) -> Response:
    return Response({"body": [f"{what} is larger than the {limit} byte limit"]},
                    status=status.HTTP_413_REQUEST_ENTITY_TOO_LARGE)  # fmt: skip


def _replace(name: str, source) -> str:
    """Put `source` under `name` in storage, replacing what was there (atomically on the file
    system, so a reader never sees half a file)."""
    try:
        target = default_storage.path(name)
    except NotImplementedError:
        if default_storage.exists(name):
            default_storage.delete(name)
        return default_storage.save(name, File(source))
    os.makedirs(os.path.dirname(target), exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=os.path.dirname(target), prefix=".upload.")
    with os.fdopen(fd, "wb") as out:
        while chunk := source.read(CHUNK):
            out.write(chunk)
    os.replace(tmp, target)
    return name


def _append(name: str, chunk: bytes) -> None:
    try:
        target = default_storage.path(name)
    except NotImplementedError:
        old = default_storage.open(name, "rb").read() if default_storage.exists(name) else b""
        if default_storage.exists(name):
            default_storage.delete(name)
        from django.core.files.base import ContentFile

        default_storage.save(name, ContentFile(old + chunk))
        return
    os.makedirs(os.path.dirname(target), exist_ok=True)
    with open(target, "ab") as out:
        out.write(chunk)


def _stored_size(name: str) -> int:
    return default_storage.size(name) if default_storage.exists(name) else 0


class LogView(AgentView):
    """PUT: the whole log so far (replaces it). POST with `X-Log-Offset: N`: a chunk appended where
    the stored log ends; 409 with the stored `size` when N is not that end (the agent resends)."""

    def _name(self, member: AttemptMember) -> str:
        return wire.log_name(str(member.attempt.job_id), member.attempt.number, member.rank)

    def put(self, request, attempt_id: int, rank: int):
        name = self._name(self.member(attempt_id, rank))
        try:
            body = _spool_body(request, settings.AGENT_LOG_MAX_BYTES)
        except TooLarge:
            return _too_large("the log", settings.AGENT_LOG_MAX_BYTES)
        with body:
            _replace(name, body)
        return Response({"size": _stored_size(name)})

    def post(self, request, attempt_id: int, rank: int):
        name = self._name(self.member(attempt_id, rank))
        try:
            offset = int(request.headers.get(wire.LOG_OFFSET_HEADER, ""))
        except ValueError:
            raise ValidationError(
                {wire.LOG_OFFSET_HEADER: ["an integer byte offset is required"]}
            ) from None
        size = _stored_size(name)
        if offset != size:
            return Response({"size": size}, status=status.HTTP_409_CONFLICT)
        limit = settings.AGENT_LOG_MAX_BYTES - size
        try:
            body = _spool_body(request, limit)
        except TooLarge:
            return _too_large("the log", settings.AGENT_LOG_MAX_BYTES)
        with body:
            _append(name, body.read())
        return Response({"size": _stored_size(name)})


def _safe_name(name: str, *, field: str) -> str:
    parts = name.split("/")
    if (
        not name
        or len(name) > 255
        or "\\" in name
        or "\0" in name
        or any(p in ("", ".", "..") for p in parts)
    ):
        raise ValidationError({field: ["a relative path of plain names, at most 255 characters"]})
    return name


class ArtifactView(AgentView):
    """PUT the file as the body; stored through the storage API (apps/jobs/services.artifact_store)."""

    def put(self, request, attempt_id: int, rank: int, name: str):
        member = self.member(attempt_id, rank)
        name = _safe_name(name, field="name")
        if rank != 0 and not name.startswith(f"rank-{rank}/"):
            raise ValidationError({"name": [f"rank {rank}'s artifacts are named rank-{rank}/..."]})
        try:
            body = _spool_body(request, settings.AGENT_ARTIFACT_MAX_BYTES)
        except TooLarge:
            return _too_large("the artifact", settings.AGENT_ARTIFACT_MAX_BYTES)
        with body:
            stored = jobs.artifact_store(attempt_id=member.attempt_id, token=str(member.attempt.token), name=name,
                                         source=body)  # fmt: skip
        return Response(
            {"stored": stored}, status=status.HTTP_201_CREATED if stored else status.HTTP_200_OK
        )


class CheckpointView(AgentView):
    """PUT: store this member's checkpoint file (its name in `X-Checkpoint-Name`); answers the
    stored name, which the agent then reports as the attempt's checkpoint. GET: the checkpoint
    this member resumes from (the newest its job stored, from any node), or 204 if none."""

    def put(self, request, attempt_id: int, rank: int):
        member = self.member(attempt_id, rank)
        filename = request.headers.get(wire.CHECKPOINT_NAME_HEADER, "checkpoint")
        if "/" in filename:
            raise ValidationError(
                {wire.CHECKPOINT_NAME_HEADER: ["a file name, without directories"]}
            )
        _safe_name(filename, field=wire.CHECKPOINT_NAME_HEADER)
        attempt = member.attempt
        name = f"checkpoints/{attempt.job_id}/attempt-{attempt.number}/rank-{rank}/{filename}"
        try:
            body = _spool_body(request, settings.AGENT_CHECKPOINT_MAX_BYTES)
        except TooLarge:
            return _too_large("the checkpoint", settings.AGENT_CHECKPOINT_MAX_BYTES)
        with body:
            _replace(name, body)
        return Response({"checkpoint": name}, status=status.HTTP_201_CREATED)

    def get(self, request, attempt_id: int, rank: int):
        name = checkpoints.rank_checkpoint(self.member(attempt_id, rank).attempt, rank)
        if not name:
            return Response(status=status.HTTP_204_NO_CONTENT)
        response = FileResponse(
            default_storage.open(name, "rb"), content_type="application/octet-stream"
        )
        response[wire.CHECKPOINT_NAME_HEADER] = name.rsplit("/", 1)[-1]
        return response


class BundleView(AgentView):
    """GET: the code bundle of the member's job (docs/own-code.md), streamed from storage, with
    its `Content-Type`, `Content-Length` and `X-Bundle-Sha256`. 404 unless the member is this
    node's, its attempt is live and the member has not ended, and its job has a bundle that its
    tenant still holds."""

    def get(self, request, attempt_id: int, rank: int):
        job = _live(self.member(attempt_id, rank)).attempt.job
        if not job.bundle:
            raise NotFound()
        bundle = Bundle.objects.filter(tenant_id=job.tenant_id, sha256=job.bundle).first()
        if bundle is None or not default_storage.exists(bundle.storage_name):
            raise NotFound()
        response = FileResponse(
            default_storage.open(bundle.storage_name, "rb"), content_type=bundle.media_type
        )
        response["Content-Length"] = str(bundle.size)
        response[wire.BUNDLE_SHA256_HEADER] = bundle.sha256
        return response


# --- a job's inputs: its dependencies' artifacts (docs/pipelines.md) ---------------------------------


class InputsView(AgentView):
    """GET: the artifacts of the member's job's parents (its `depends_on`), only those: the agent
    downloads them for the job before it starts (workers/inputs.py). 404 unless the member is
    placed here, its token matches and its attempt is live."""

    def get(self, request, attempt_id: int, rank: int):
        job = _live(self.member(attempt_id, rank)).attempt.job
        return Response({"inputs": [_input(a) for a in dependencies.input_artifacts(job)]})


class InputView(AgentView):
    """GET: stream one artifact of one of the member's job's parents; 404 for any other."""

    def get(self, request, attempt_id: int, rank: int, job_id: uuid.UUID, name: str):
        job = _live(self.member(attempt_id, rank)).attempt.job
        artifact = dependencies.input_artifact(job, job_id, name)
        if artifact is None or not default_storage.exists(artifact.file.name):
            raise NotFound()
        response = FileResponse(
            default_storage.open(artifact.file.name, "rb"), content_type="application/octet-stream"
        )
        response["Content-Length"] = str(artifact.size)
        response["X-Artifact-Sha256"] = artifact.sha256
        return response


def _live(member: AttemptMember, *, stopping: bool = True) -> AttemptMember:
    """The member endpoints' liveness rule, 404 unless: the member's attempt is active and the
    member has not ended; with `stopping=False` (secrets), its attempt not asked to stop either.
    A member asked to stop is not to start, and one running has its values already: refusing is
    safest. Its bundle and inputs are still served: the agent reads a bundle's 404 as final (the
    bundle is gone) and an input's as a failed start, which would turn a cancel or a preemption
    racing the start into a failure of the job."""
    attempt = member.attempt
    if attempt.state not in ATTEMPT_ACTIVE or member.ended_at is not None:
        raise NotFound()
    if attempt.stop_requested and not stopping:
        raise NotFound()
    return member


def _input(artifact) -> dict:
    job = artifact.job  # a task of an array says which: the evaluate step of a sweep reads each
    return {"job": str(artifact.job_id), "name": artifact.name, "size": artifact.size, "sha256": artifact.sha256,
            "array": str(job.array_id) if job.array_id else None, "array_index": job.array_index}  # fmt: skip
