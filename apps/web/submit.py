"""The submit page's form: HTML inputs in, the API's submission body out.

The page validates nothing itself. It turns form strings into the JSON types the API expects
and submits them through the API's own use case (apps/admission/submit.py `submit_job`), so a
submission is accepted or refused the same way whichever door it came through. Errors are spread back onto the form's fields. Each
rendering of the form carries a fresh Idempotency-Key, so a double click submits once.

"Your own code": a command (split as a shell would, though no shell runs it) instead of the
template, and optionally a zip (or .tar.gz) of its working directory, stored as a bundle exactly
as `POST /api/v1/bundles/` stores one (apps/bundles/services.py `store`: streamed from the
uploaded file, the tenant's cap, deduplicated) and submitted as the body's `bundle`. An OCI
image (`image`, and the name of the tenant secret with its registry's credentials,
`image_pull_secret`; docs/images.md) goes with a command, or alone: the image's own Cmd runs.

Dependencies: one text input, the CLI's `--depends-on` shapes separated by commas or spaces
(`afterok:<job id>, afterany:array:<array id>`, docs/pipelines.md), each turned into a body
entry. An id without `job:` or `array:` is the tenant's job of that id, else its array (the
API answers one that is neither: "no job <id>").
"""

from __future__ import annotations

import re
import shlex
import uuid
from dataclasses import dataclass, field

from django.core.files.uploadedfile import UploadedFile
from django.http import QueryDict
from rest_framework.exceptions import ValidationError

from apps.admission.submit import submit_job
from apps.bundles import services as bundles
from apps.jobs import dependencies, services
from apps.jobs.models import Job, JobArray, JobTemplate
from apps.tenants.models import Membership

PARAM_PREFIX = "param_"
FORM_FIELDS = {"template", "params", "name", "gpus", "nodes", "gpu_sku", "tier", "command", "workdir",
               "bundle", "env", "python", "secrets", "depends_on", "max_runtime_seconds", "array",
               "array_params", "array_grid", "image", "image_pull_secret"}  # fmt: skip
DEPENDENCY_SHAPE = (
    f"write [condition:][job:|array:]<id>, the condition one of {', '.join(dependencies.CONDITIONS)} "
    "(afterok if left out)"
)


def new_idempotency_key() -> str:
    return f"web-{uuid.uuid4()}"


@dataclass(frozen=True)
class ParamField:
    """One input of a template's parameters, described by the template's `params_schema`."""

    name: str
    kind: str
    required: bool
    default: object
    minimum: object
    maximum: object
    value: str
    errors: list[str]

    @property
    def input_name(self) -> str:
        return PARAM_PREFIX + self.name

    @property
    def input_type(self) -> str:
        return {"integer": "number", "number": "number", "boolean": "checkbox"}.get(
            self.kind, "text"
        )

    @property
    def step(self) -> str:
        return "1" if self.kind == "integer" else "any"

    @property
    def checked(self) -> bool:
        return self.value in ("on", "true", "True")


def param_fields(template: JobTemplate | None, data: QueryDict | None = None,
                 errors: dict | None = None) -> list[ParamField]:  # fmt: skip
    if template is None:
        return []
    fields = []
    for name, spec in template.params_schema.items():
        default = spec.get("default")
        if data is not None:
            value = data.get(PARAM_PREFIX + name, "")
        else:
            value = "" if default is None else ("on" if default is True else str(default))
        fields.append(ParamField(
            name=name, kind=spec.get("type", "string"), required=bool(spec.get("required")), default=default,
            minimum=spec.get("minimum"), maximum=spec.get("maximum"), value=value,
            errors=(errors or {}).get(name, []),
        ))  # fmt: skip
    return fields


def _number(raw: str, kind: str):
    """ "3" -> 3, "0.5" -> 0.5; anything else stays a string so the serializer names the field."""
    try:
        return int(raw) if kind == "integer" else float(raw)
    except ValueError:
        return raw


class FormRefused(Exception):
    def __init__(self, errors: dict[str, list[str]]):
        self.errors = errors


def own_code_body(data: QueryDict, workdir: UploadedFile | None, membership: Membership,
                  user) -> dict | None:  # fmt: skip
    """The command (and bundle, and image) part of the body when the form gives a command or an
    image, else None (a template's submit). A working directory needs a command to run in it;
    an image alone runs its own Cmd."""
    text = data.get("command", "").strip()
    image = {key: data.get(key, "").strip() for key in ("image", "image_pull_secret")}
    image = {key: value for key, value in image.items() if value}
    if not text and workdir is not None:
        raise FormRefused({"command": ["give the command to run in the uploaded directory"]})
    if not text and not image:
        return None  # the API answers a pull secret without an image, naming the field
    try:
        argv = shlex.split(text)
    except ValueError as error:
        raise FormRefused({"command": [f"cannot split it into arguments: {error}"]}) from None
    body: dict = {"command": argv, **image} if argv else dict(image)
    if workdir is not None:
        head = workdir.read(2)
        workdir.seek(0)
        kind = "application/gzip" if head == bundles.GZIP_MAGIC else "application/zip"
        try:
            stored = bundles.store(tenant=membership.tenant, user=user, source=workdir,
                                   content_type=kind, length=workdir.size)  # fmt: skip
        except bundles.BundleRefused as refused:
            raise FormRefused({"workdir": [refused.message]}) from None
        body["bundle"] = stored.bundle.sha256
    return body


def env_body(data: QueryDict) -> dict[str, str]:
    """The environment box: one NAME=value a line (blank lines skipped), as the body's `env`;
    the API checks the names and values."""
    env: dict[str, str] = {}
    for number, line in enumerate(data.get("env", "").splitlines(), start=1):
        if not line.strip():
            continue
        name, equals, value = line.partition("=")
        if not equals or not name.strip():
            raise FormRefused({"env": [f"line {number}: write NAME=value"]})
        env[name.strip()] = value
    return env


def dependency_entries(data: QueryDict) -> list[str]:
    """The dependencies as typed, one string each."""
    return data.get("depends_on", "").replace(",", " ").split()


def depends_on_body(entries: list[str], tenant) -> list[dict]:
    """The body's `depends_on` from the typed entries."""
    return [_dependency(entry, tenant) for entry in entries]


def _dependency(entry: str, tenant) -> dict:
    *words, raw = entry.split(":")
    condition = words.pop(0) if words and words[0] in dependencies.CONDITIONS else "afterok"
    kind = words.pop(0) if words and words[0] in ("job", "array") else None
    if words or not raw:
        raise FormRefused({"depends_on": [f"{entry}: {DEPENDENCY_SHAPE}"]})
    try:
        parent = uuid.UUID(raw)
    except ValueError:
        raise FormRefused({"depends_on": [f"{entry}: {raw} is not a job or array id"]}) from None
    if kind is None:
        kind = "array" if condition == dependencies.AFTERCORR else _kind_of(parent, tenant)
    return {kind: str(parent), "condition": condition}


def _kind_of(parent: uuid.UUID, tenant) -> str:
    return "array" if JobArray.objects.filter(pk=parent, tenant=tenant).exists() else "job"


def submission_body(data: QueryDict, template: JobTemplate | None,
                    own_code: dict | None = None, depends_on: list[dict] | None = None) -> dict:  # fmt: skip
    body: dict = own_code or {"template": data.get("template", "")}
    if depends_on:
        body["depends_on"] = depends_on
    for key in ("gpus", "nodes", "max_runtime_seconds"):
        raw = data.get(key, "").strip()
        if raw:
            body[key] = _number(raw, "integer")
    for key in ("name", "tier"):
        raw = data.get(key, "").strip()
        if raw:
            body[key] = raw
    body["gpu_sku"] = data.get("gpu_sku", "").strip() or None
    array = data.get("array", "").strip()
    if array:
        body["array"] = array  # Slurm's syntax, "0-99%8" (docs/arrays.md)
    if template is not None and own_code is None:
        body["params"] = _params(data, template)
    return body


def _params(data: QueryDict, template: JobTemplate) -> dict:
    params: dict[str, object] = {}
    for name, spec in template.params_schema.items():
        kind = spec.get("type", "string")
        raw = data.get(PARAM_PREFIX + name, "")
        if kind == "boolean":
            params[name] = raw in ("on", "true")
        elif kind in ("integer", "number"):
            if raw.strip():
                params[name] = _number(raw.strip(), kind)
        elif raw:
            params[name] = raw
    return params


@dataclass
class Outcome:
    job: Job | None = None
    array: JobArray | None = None
    errors: dict[str, list[str]] = field(default_factory=dict)
    param_errors: dict[str, list[str]] = field(default_factory=dict)


def submit(*, membership: Membership, user, data: QueryDict, template: JobTemplate | None,
           workdir: UploadedFile | None = None) -> Outcome:  # fmt: skip
    entries = dependency_entries(data)
    try:
        depends_on = depends_on_body(entries, membership.tenant)
        own_code = own_code_body(data, workdir, membership, user)
        body = submission_body(data, template, own_code, depends_on)
        env = env_body(data)
        if env:
            body["env"] = env
    except FormRefused as refused:
        return Outcome(errors=refused.errors)
    try:
        submitted = submit_job(user=user, body=body, idempotency_key=data.get("idempotency_key") or None,
                               membership=membership)  # fmt: skip
    except ValidationError as error:
        assert isinstance(error.detail, dict)  # a serializer's errors are always by field
        return _spread_errors(error.detail, entries)
    except services.ServiceError as error:
        message = error.message
        if error.retry_after:
            message += f" (try again in {error.retry_after} s)"
        return Outcome(errors={error.field if error.field in FORM_FIELDS else "form": [message]})
    return Outcome(job=submitted.job, array=submitted.array)


def _spread_errors(errors: dict, entries: list[str]) -> Outcome:
    outcome = Outcome()
    for key, value in errors.items():
        if key == "depends_on":
            outcome.errors[key] = [_as_typed(str(m), entries) for m in value]
        elif key == "params" and isinstance(value, dict):
            outcome.param_errors = {
                name: [str(m) for m in messages] for name, messages in value.items()
            }
        elif key == "non_field_errors":
            outcome.errors["form"] = [str(m) for m in value]
        else:
            outcome.errors[key] = [str(m) for m in (value if isinstance(value, list) else [value])]
    return outcome


def _as_typed(message: str, entries: list[str]) -> str:
    """The API's "entry 2: ..." names the third dependency as the person typed it."""
    found = re.match(r"entry (\d+): ", message)
    if found and int(found.group(1)) < len(entries):
        return f"{entries[int(found.group(1))]}: {message[found.end() :]}"
    return message
