"""The agent API's image endpoint (docs/images.md): `members/<attempt>/<rank>/image/`.

- GET: the registry's `user:password` from the tenant secret the job's `image_pull_secret` names,
  `{"auth": "user:password"}` (`{"auth": null}` without one), `Cache-Control: no-store`; only for
  a live member not asked to stop (as the secrets endpoint); a deleted secret is 410, one no key
  decrypts 409 (the agent fails the member: no retry).
- POST `{"digest": "sha256:<64 hex>"}`: the manifest digest the member's pull resolved. The first
  one reported is the job's `image_digest` for good (later attempts pull it); `{"image_digest":
  the job's}` answers, so an agent that raced another member's report runs the fixed one.
"""

from __future__ import annotations

from django.views.decorators.debug import sensitive_variables
from rest_framework import serializers, status
from rest_framework.response import Response

from apps.jobs.models import Job
from apps.nodes.agent_api import AgentView, _live
from apps.platform.images import DIGEST
from apps.secrets.crypto import SecretUnreadable
from apps.secrets.services import secret_values


class DigestReport(serializers.Serializer):
    digest = serializers.RegexField(DIGEST.pattern, max_length=71)


class ImageView(AgentView):
    @sensitive_variables()  # an error report shows none of its locals (the password)
    def get(self, request, attempt_id: int, rank: int):
        job = _live(self.member(attempt_id, rank), stopping=False).attempt.job
        name = job.image_pull_secret
        if not name:
            response = Response({"auth": None})
        else:
            try:
                values, missing = secret_values(tenant_id=job.tenant_id, names=[name])
            except SecretUnreadable as error:
                response = Response({"detail": str(error)}, status=status.HTTP_409_CONFLICT)
            else:
                if missing:
                    response = Response(
                        {"detail": f"secret {name} no longer exists"}, status=status.HTTP_410_GONE
                    )
                else:
                    response = Response({"auth": values[name]})
        response["Cache-Control"] = "no-store"
        return response

    def post(self, request, attempt_id: int, rank: int):
        job = _live(self.member(attempt_id, rank)).attempt.job
        body = DigestReport(data=request.data)
        body.is_valid(raise_exception=True)
        if job.image:
            Job.objects.filter(pk=job.pk, image_digest="").update(
                image_digest=body.validated_data["digest"]
            )
        digest = Job.objects.filter(pk=job.pk).values_list("image_digest", flat=True).first()
        return Response({"image_digest": digest or ""})
