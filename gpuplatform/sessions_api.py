"""`POST /api/v1/jobs/{id}/sessions/`: open a shell, an exec or a port-forward on a running job
(docs/interactive.md). The answer names the session and a one-time ticket; the client then opens
the session's websocket (`/api/v1/sessions/{session}/`, gpuplatform/relay.py) with it.

Body: `{"kind": "shell"|"exec"|"forward", "rank": 0, "argv": [...], "tty": bool, "rows": 24,
"cols": 80, "term": "xterm-256color", "port": 8888}`. Refusals as every API call: another
tenant's job 404, a viewer 403, a job not running 409, over the session caps 429 + Retry-After.
"""

from __future__ import annotations

from drf_spectacular.utils import extend_schema
from rest_framework import serializers, status
from rest_framework.exceptions import NotFound
from rest_framework.permissions import IsAuthenticated
from rest_framework.response import Response
from rest_framework.views import APIView

from apps.jobs.access import visible_jobs
from apps.jobs.fields import ArgvField, StrictBooleanField, StrictCharField, StrictIntegerField
from apps.jobs.lookup import resolve
from apps.platform.errors import UnknownObject
from apps.scheduling import sessions

MAX_RANK = 1024


class SessionRequestSerializer(serializers.Serializer):
    kind = serializers.ChoiceField(choices=sessions.KINDS)
    rank = StrictIntegerField(min_value=0, max_value=MAX_RANK, required=False, default=0)
    argv = ArgvField(required=False)
    tty = StrictBooleanField(required=False, default=False)
    rows = StrictIntegerField(min_value=1, max_value=1000, required=False, default=24)
    cols = StrictIntegerField(min_value=1, max_value=1000, required=False, default=80)
    term = StrictCharField(max_length=64, required=False, default="xterm-256color")
    port = StrictIntegerField(min_value=1, max_value=65535, required=False)

    def validate(self, attrs):
        if attrs["kind"] == sessions.EXEC and not attrs.get("argv"):
            raise serializers.ValidationError({"argv": ["exec needs a command"]})
        if attrs["kind"] == sessions.FORWARD and not attrs.get("port"):
            raise serializers.ValidationError({"port": ["port-forward needs the job's port"]})
        return attrs


class SessionOpenedSerializer(serializers.Serializer):
    session = serializers.CharField()
    ticket = serializers.CharField(
        help_text="Presented once, as X-Session-Ticket, on the websocket."
    )
    node = serializers.CharField()
    url = serializers.CharField(help_text="The session's websocket path.")


class JobSessionsView(APIView):
    permission_classes = [IsAuthenticated]

    @extend_schema(request=SessionRequestSerializer, responses={201: SessionOpenedSerializer})
    def post(self, request, pk):
        body = SessionRequestSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        data = body.validated_data
        wanted = sessions.Request(
            kind=data["kind"], rank=data["rank"], argv=tuple(data.get("argv") or ()),
            tty=data["tty"], rows=data["rows"], cols=data["cols"], term=data["term"],
            port=data.get("port") or 0,
        )  # fmt: skip
        jobs = visible_jobs(request.user)  # `pk`: the id or a unique prefix (apps/jobs/lookup.py)
        job_id = resolve(jobs, pk, what="job")
        try:
            opened = sessions.open_session(user=request.user, token_id=getattr(request.auth, "pk", None),
                                           job_id=job_id, request=wanted)  # fmt: skip
        except UnknownObject:
            raise NotFound() from None  # DRF's own 404 shape, as every other unknown id
        return Response(
            {"session": opened.session, "ticket": opened.ticket, "node": opened.node,
             "url": f"/api/v1/sessions/{opened.session}/"},
            status=status.HTTP_201_CREATED,
        )  # fmt: skip
