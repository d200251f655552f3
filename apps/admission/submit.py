"""One submit, whichever door it came through (the API's `POST /api/v1/jobs/`, which the CLI
and SDK call, and the web form): who is submitting, the body's validation (the jobs API's
`JobSubmitSerializer`), then admission (apps/admission/services.py: idempotent replay, rate
limits, GPU-hour quota, queued-job cap, result cache). Refusals are raised as the errors the
API's exception handler already answers: DRF's PermissionDenied (403) and ValidationError
(400, per field), and the ServiceErrors (403, 409, 429, 503, with Retry-After).
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass, field

from rest_framework.exceptions import PermissionDenied, ValidationError

from apps.admission import arrays, fit
from apps.admission.services import Admission, submitter
from apps.bundles import services as bundles
from apps.jobs.models import Job, JobArray
from apps.jobs.serializers import spec_from, validate_submission
from apps.secrets.services import missing_secrets
from apps.tenants.models import Membership, Tenant


class Unread(enum.Enum):
    """`membership` not given: `submit_job` reads it."""

    UNREAD = "unread"


UNREAD = Unread.UNREAD


@dataclass
class Submitted:
    job: Job
    created: bool  # False: an idempotent replay answered with the job an earlier request created
    # X-RateLimit-* (a refusal carries them too: submit_job's `headers`)
    headers: dict[str, str] = field(default_factory=dict)
    # A submit with `array` (docs/arrays.md): the array; `job` is its first task (not saved where
    # the array was written as its row alone: the row the dispatcher will make).
    array: JobArray | None = None


def submit_job(*, user, body, idempotency_key: str | None, membership: Membership | None | Unread = UNREAD,
               headers: dict | None = None) -> Submitted:  # fmt: skip
    """Submit `body` (a dict, or a function that returns it: the API's body is parsed on first
    read, and a parse error comes after the permission checks of a submitter read with the
    token) for `user`.

    `membership`: the user's, as apps.admission.services.submitter gives it (with the template
    and SKU the body names), where the caller read it already (the token's lookup); else it is
    read here, with the names the body gives. `headers`: filled with the rate limit's headers as
    soon as the check has run, so that a refusal raised after it carries them too."""
    if isinstance(membership, Unread):
        body = _read(body)
        membership = submitter(user, **names_in(body))
    if membership is None:
        raise PermissionDenied("you belong to no tenant")
    if not membership.can_submit:
        raise PermissionDenied(f"role {membership.role} may not submit jobs")
    body = _read(body)
    if not isinstance(body, dict):
        raise ValidationError({"body": ["must be a JSON object"]})
    admission = Admission.start(
        tenant=membership.tenant, user=user, body=body, idempotency_key=idempotency_key
    )
    if headers is not None:
        headers.update(admission.headers)
    admission.raise_if_refused()
    if not admission.replayed:
        data = validate_submission(
            body, named=getattr(membership, "named", None)
        )  # JobSubmitSerializer's rules
        check_own_code(membership.tenant, data)
        fit.check(data)  # a 400 for what no node could ever run (apps/admission/fit.py)
        spec = spec_from(data, default_tier=membership.tenant.tier)
        depends_on = data.get("depends_on") or []
        if data.get("array") is not None:  # one request, one rate-limit token, whatever its size
            made, first, created = arrays.submit_array(
                tenant=admission.tenant, user=user, spec=spec, array=data["array"],
                params=data["array_params"], grid=data["array_grid"], limits=admission.limits,
                key=admission.key, digest=admission.digest, depends_on=depends_on,
            )  # fmt: skip
            return Submitted(job=first, created=created, headers=admission.headers, array=made)
        admission.submit(spec, depends_on=depends_on)
    assert admission.job is not None  # a replay's, or the one submit() made (else it raised)
    replayed = admission.job.array if admission.job.array_id is not None else None
    return Submitted(job=admission.job, created=admission.created, headers=admission.headers,
                     array=replayed)  # fmt: skip


def check_own_code(tenant: Tenant, data: dict) -> None:
    """The own-code fields' checks that need the tenant (docs/own-code.md); their shapes were
    checked with the body. A `bundle` must be one this tenant uploaded; another tenant's digest
    is refused with exactly the words of one nobody uploaded, so a submit cannot probe for other
    tenants' bundles. Naming it counts as its use (retention counts from its last use)."""
    digest = data.get("bundle")
    if digest and not bundles.use(tenant.pk, digest):
        raise ValidationError(
            {
                "bundle": [
                    f"no bundle {digest} in this tenant: upload it first (POST /api/v1/bundles/)"
                ]
            }
        )
    check_secrets(tenant, data.get("secrets") or [])
    pull_secret = data.get("image_pull_secret")
    if pull_secret and missing_secrets(tenant_id=tenant.pk, names=[pull_secret]):
        raise ValidationError(
            {"image_pull_secret": [f"no secret named {pull_secret} in this tenant"]}
        )


def check_secrets(tenant: Tenant, names: list[str]) -> None:
    """Every secret the body names exists in the submitter's tenant now: another tenant's is
    refused with the words of one that never was. The names' syntax (and reserved names) is
    checked already (apps/jobs/own_code.py). One query, none without secrets. A secret deleted
    after the submit fails the job's start instead (the agent API's secrets endpoint, 410)."""
    missing = missing_secrets(tenant_id=tenant.pk, names=names)
    if missing:
        unknown = ", ".join(missing)
        raise ValidationError({"secrets": [f"no secret named {unknown} in this tenant"]})


def names_in(body) -> dict:
    """The template and SKU a body names, as `submitter` takes them (read with the membership)."""
    if not isinstance(body, dict):
        return {}
    named = (("template", "template"), ("sku", "gpu_sku"))
    return {kind: v for kind, name in named if isinstance(v := body.get(name), str)}


def _read(body: object | Callable[[], object]):
    return body() if callable(body) else body
