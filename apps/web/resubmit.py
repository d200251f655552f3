"""The job page's resubmit: the job's own spec, submitted again as a new job through the API's
use case (apps/admission/submit.py `submit_job`: the same rate limits, caps and checks as
`POST /api/v1/jobs/`). An array's task comes back as a job of its own, with that task's params;
dependencies are not carried over (the parents have run)."""

from __future__ import annotations

from dataclasses import MISSING
from dataclasses import fields as dataclass_fields

from rest_framework.exceptions import ValidationError

from apps.admission.submit import submit_job
from apps.jobs import services
from apps.jobs.models import Job
from apps.tenants.models import Membership

NAMED = {"template", "tier", "gpu_sku"}  # rows on the job, names in a body
LEFT_OUT_WHEN_EMPTY = {"template", "params", "command"}
# A field the spec has a default for is left out at its default: a field added to the spec later
# (an image, an interactive job's idle timeout) never makes every resubmit a 400.
DEFAULTS = {
    f.name: f.default_factory() if f.default_factory is not MISSING else f.default
    for f in dataclass_fields(services.JobSpec)
    if f.default is not MISSING or f.default_factory is not MISSING
}


def body_of(job: Job) -> dict:
    """The submit body that makes a job with this job's spec."""
    body: dict = {}
    for name in services.SPEC_FIELDS:
        value = getattr(job, name)
        if name in NAMED:
            value = value.name if value is not None else None
        if (name in LEFT_OUT_WHEN_EMPTY and not value) or (
            name in DEFAULTS and value == DEFAULTS[name]
        ):
            continue
        body[name] = value
    if "command" in body:
        body.pop("params", None)  # a command's job has no template parameters
    return body


def resubmit(*, job: Job, membership: Membership, user, idempotency_key: str | None) -> tuple[Job | None, str]:  # fmt: skip
    """(the new job, "") or (None, why it was refused, naming the field)."""
    try:
        submitted = submit_job(user=user, body=body_of(job), idempotency_key=idempotency_key,
                               membership=membership)  # fmt: skip
    except ValidationError as error:
        detail = error.detail if isinstance(error.detail, dict) else {"body": error.detail}
        return None, "; ".join(f"{field}: {' '.join(map(str, m if isinstance(m, list) else [m]))}"
                               for field, m in detail.items())  # fmt: skip
    except services.ServiceError as error:
        wait = f" (try again in {error.retry_after} s)" if error.retry_after else ""
        return None, f"{error.field or 'job'}: {error.message}{wait}"
    return submitted.job, ""
