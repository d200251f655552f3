"""Input and output shapes of the jobs API. Serializers validate and shape; they never write."""

import threading
import uuid
from datetime import timedelta

from django.conf import settings
from django.core.exceptions import ValidationError as DjangoValidationError
from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers
from rest_framework.fields import SkipField, empty, get_error_detail
from rest_framework.relations import PKOnlyObject

from apps.admission import rows
from apps.admission.estimates import Estimator
from apps.jobs import arrays as array_tasks
from apps.jobs import arrayspec, dependencies
from apps.jobs.arrayspec import task_params
from apps.jobs.fields import (
    ArgvField,
    LabelMapField,
    StrictBooleanField,
    StrictCharField,
    StrictIntegerField,
)
from apps.jobs.models import Artifact, Job, JobArray, JobAttempt, JobState, JobTemplate
from apps.jobs.naming import command_name
from apps.jobs.own_code import (
    BundleDigestField,
    EnvField,
    ImageField,
    PullSecretField,
    PythonField,
    SecretNamesField,
    own_code_errors,
)
from apps.jobs.params import ParamsError, validate_params
from apps.jobs.services import SPEC_FIELDS, JobSpec
from apps.nodes.models import GpuSku
from apps.scheduling.core import waiting
from apps.scheduling.dispatcher import queue_position
from apps.tenants.models import Tier

MAX_GPUS_PER_NODE = 64
MAX_GANG_NODES = 64
# Cgroup limits a job may ask for (0: the node's default): up to 16 TiB of memory, the kernel's
# largest pid_max, cgroup v2's cpu.weight scale.
MAX_MEMORY_MIB = 16 * 1024 * 1024
MAX_PIDS = 4 * 1024 * 1024
MAX_CPU_WEIGHT = 10000
LIMIT_FIELDS = ("memory_mib", "pids_max", "cpu_weight")
# Body fields that are no field of the job itself: the submit use case passes them beside the
# spec (apps/admission/submit.py), the job object shows them.
RELATION_FIELDS = ("depends_on", "array")


UNSTORABLE = "text must not contain NUL characters or unpaired surrogates"


def _unstorable(value) -> bool:
    """True when a string anywhere in `value` (keys too) cannot be stored: PostgreSQL refuses NUL
    in text and JSON, and a lone surrogate has no UTF-8 form (both were a 500 before)."""
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            return True
        return "\x00" in value
    if isinstance(value, dict):
        return any(_unstorable(key) or _unstorable(item) for key, item in value.items())
    if isinstance(value, list):
        return any(_unstorable(item) for item in value)
    return False


UUID_STRING = {"type": "string", "format": "uuid"}
DEPENDS_ON_SCHEMA = {
    "type": "array",
    "maxItems": dependencies.MAX_DEPENDENCIES,
    "items": {
        "type": "object",
        "properties": {
            "job": UUID_STRING,
            "array": UUID_STRING,
            "condition": {
                "type": "string",
                "enum": list(dependencies.CONDITIONS),
                "default": "afterok",
            },
        },
        "oneOf": [{"required": ["job"]}, {"required": ["array"]}],
        "additionalProperties": False,
    },
    "description": 'the jobs or arrays this one waits for (docs/pipelines.md); "aftercorr" only '
    "with an array; another tenant's id is not found (404)",
}


@extend_schema_field(DEPENDS_ON_SCHEMA)
class DependsOnField(serializers.Field):
    """`[{"job": "<id>", "condition": "afterok"}, ...]` (docs/pipelines.md): a list of
    dependencies.Wanted. The ids are looked up at admission (another tenant's or none: 404)."""

    def to_internal_value(self, data) -> list[dependencies.Wanted]:
        if not isinstance(data, list):
            raise serializers.ValidationError(
                'must be a list such as [{"job": "<id>", "condition": "afterok"}]'
            )
        if len(data) > dependencies.MAX_DEPENDENCIES:
            raise serializers.ValidationError(
                f"at most {dependencies.MAX_DEPENDENCIES} dependencies, not {len(data)}"
            )
        return [self._entry(i, entry) for i, entry in enumerate(data)]

    def _entry(self, i: int, entry) -> dependencies.Wanted:
        where = f"entry {i}"
        if not isinstance(entry, dict):
            raise serializers.ValidationError(
                f'{where}: must be an object {{"job": "<id>", "condition": ...}}'
            )
        kinds = [kind for kind in ("job", "array") if kind in entry]
        unknown = sorted(set(entry) - {"job", "array", "condition"})
        if unknown:
            raise serializers.ValidationError(f"{where}: unknown key(s) {', '.join(unknown)}")
        if len(kinds) != 1:
            raise serializers.ValidationError(f'{where}: give one of "job" or "array"')
        kind, raw = kinds[0], entry[kinds[0]]
        try:
            if not isinstance(raw, str):
                raise ValueError
            parent = uuid.UUID(raw)
        except ValueError:
            raise serializers.ValidationError(
                f"{where}: {kind} must be an id (a UUID string)"
            ) from None
        condition = entry.get("condition", "afterok")
        if condition not in dependencies.CONDITIONS:
            raise serializers.ValidationError(
                f"{where}: unknown condition {condition!r} (one of {', '.join(dependencies.CONDITIONS)})"
            )
        if condition == "aftercorr" and kind != "array":
            raise serializers.ValidationError(
                f"{where}: aftercorr is for an array (task i after task i)"
            )
        return dependencies.Wanted(kind=kind, id=parent, condition=condition)

    def to_representation(self, value):
        return [{w.kind: str(w.id), "condition": w.condition} for w in value]


class JobSubmitSerializer(serializers.Serializer):
    name = StrictCharField(max_length=100, required=False, allow_blank=False)
    template = StrictCharField(max_length=64, required=False)
    params = serializers.JSONField(required=False)
    command = ArgvField(required=False)
    gpus = StrictIntegerField(min_value=0, max_value=MAX_GPUS_PER_NODE, required=False, default=1)
    nodes = StrictIntegerField(min_value=1, max_value=MAX_GANG_NODES, required=False, default=1)
    gpu_sku = StrictCharField(max_length=64, required=False, allow_null=True)
    node_selector = LabelMapField(required=False, default=dict)
    tier = StrictCharField(max_length=32, required=False)
    max_runtime_seconds = StrictIntegerField(min_value=1, required=False)
    checkpointable = StrictBooleanField(required=False)
    cacheable = StrictBooleanField(required=False)
    retry_on_failure = StrictBooleanField(required=False, default=False)
    memory_mib = StrictIntegerField(min_value=0, max_value=MAX_MEMORY_MIB, required=False)
    pids_max = StrictIntegerField(min_value=0, max_value=MAX_PIDS, required=False)
    cpu_weight = StrictIntegerField(min_value=0, max_value=MAX_CPU_WEIGHT, required=False)
    # Own code (apps/jobs/own_code.py, docs/own-code.md); the tenant's checks: at submit.
    bundle = BundleDigestField(required=False)
    env = EnvField(required=False)
    secrets = SecretNamesField(required=False)
    python = PythonField(required=False)
    # An OCI image as the job's root (docs/images.md); its Cmd runs where no command is given.
    image = ImageField(required=False)
    image_pull_secret = PullSecretField(required=False)
    # A job array (docs/arrays.md): Slurm's --array syntax, and per-task params (one of the two).
    array = serializers.JSONField(required=False, help_text='e.g. "0-999%16"')
    array_params = serializers.JSONField(required=False)
    array_grid = serializers.JSONField(required=False)
    depends_on = DependsOnField(required=False)
    # An interactive job (docs/interactive.md): `command`, if given, is what its shells run.
    interactive = StrictBooleanField(required=False, default=False)
    idle_timeout_minutes = serializers.FloatField(
        min_value=0.01, max_value=7 * 24 * 60, required=False
    )

    def to_internal_value(self, data):
        if not isinstance(data, dict):
            raise serializers.ValidationError({"body": ["must be a JSON object"]})
        unknown = sorted(set(data) - set(self.fields))
        if unknown:
            raise serializers.ValidationError({name: ["unknown field"] for name in unknown})
        unstorable = [name for name, value in data.items() if _unstorable(value)]
        if unstorable:
            raise serializers.ValidationError({name: [UNSTORABLE] for name in unstorable})
        return self.checked(data)

    def checked(self, data: dict) -> dict:
        """DRF's `Serializer.to_internal_value` loop for a JSON object (every field in order:
        its `run_validation`, then the serializer's `validate_<name>`; the errors by field),
        without its work for the fields a body leaves out. DRF would look each up, find it
        empty and, for an optional field with no default, raise and catch SkipField: 24 of the
        29 fields of a minimal body, ~1.5 us each. Such a field is passed over here at once; a
        required one or one with a default still goes through `run_validation` (DRF's
        `required` error, or the default). No field here reads a body its own way
        (`get_value`), and a submit is never partial."""
        ret: dict = {}
        errors: dict = {}
        for name, field, validate in self.plan():
            if name in data:
                primitive = data[name]
            elif not field.required and field.default is empty:
                continue  # what DRF's get_default would raise SkipField for
            else:
                primitive = empty
            try:
                value = field.run_validation(primitive)
                if validate is not None:
                    value = validate(value)
            except serializers.ValidationError as exc:
                errors[name] = exc.detail
            except DjangoValidationError as exc:
                errors[name] = get_error_detail(exc)
            except SkipField:
                pass
            else:
                self.set_value(ret, field.source_attrs, value)
        if errors:
            raise serializers.ValidationError(errors)
        return ret

    checking_plan: list | None = None  # `plan()`'s, once made

    def plan(self) -> list:
        """(name, field, the serializer's validate_<name> or None) for each writable field, in
        order; made once for this serializer (one a thread: `validate_submission`)."""
        if self.checking_plan is None:
            self.checking_plan = [
                (field.field_name, field, getattr(self, f"validate_{field.field_name}", None))
                for field in self.fields.values()
                if not field.read_only
            ]
        return self.checking_plan

    def validate_template(self, value: str) -> JobTemplate:
        template = self._named("template", value, rows.template_named)
        if template is None:
            known = ", ".join(JobTemplate.objects.values_list("name", flat=True))
            raise serializers.ValidationError(f"unknown template {value!r} (known: {known})")
        return template

    def validate_gpu_sku(self, value: str | None) -> GpuSku | None:
        if value is None:
            return None
        sku = self._named("sku", value, rows.sku_named)
        if sku is None:
            known = ", ".join(GpuSku.objects.values_list("name", flat=True)) or "none registered"
            raise serializers.ValidationError(f"unknown GPU SKU {value!r} (known: {known})")
        return sku

    named: dict = {}  # noqa: RUF012 (validate_submission sets its instance's own)

    def _named(self, kind: str, name: str, read):
        """The row of that name, read with the submitter's membership when it was (`named`, or
        the context's "named": rows.membership_of), else now."""
        named = self.named or self.context.get("named") or {}
        return named[kind, name] if (kind, name) in named else read(name)

    def validate_tier(self, value: str) -> Tier:
        tier = Tier.objects.filter(name=value).first()
        if tier is None:
            raise serializers.ValidationError(f"unknown tier {value!r}")
        return tier

    def validate_max_runtime_seconds(self, value: int) -> int:
        if value > settings.MAX_RUNTIME_LIMIT_SECONDS:
            raise serializers.ValidationError(
                f"must be at most {settings.MAX_RUNTIME_LIMIT_SECONDS}"
            )
        return value

    def validate(self, attrs):
        own_code = own_code_errors(attrs)
        if own_code:
            raise serializers.ValidationError(own_code)
        template, command = attrs.get("template"), attrs.get("command")
        interactive_errors(attrs)
        if (
            template is None
            and command is None
            and not attrs.get("image")
            and not attrs.get("interactive")
        ):
            raise serializers.ValidationError({"template": ["give a template or a command"]})
        if template is not None and command is not None:
            raise serializers.ValidationError(
                {"command": ["give either a template or a command, not both"]}
            )
        if template is not None:
            try:
                attrs["params"] = validate_params(template.params_schema, attrs.get("params", {}))
            except ParamsError as error:
                raise serializers.ValidationError(
                    {"params": {k: [v] for k, v in error.errors.items()}}
                ) from None
        elif attrs.get("params"):
            raise serializers.ValidationError({"params": ["params are only for templates"]})
        if any(name in attrs for name in ARRAY_FIELDS):
            attrs.update(_array_fields(attrs, template))
        return attrs

    def to_spec(self, *, default_tier: Tier) -> JobSpec:
        return spec_from(self.validated_data, default_tier=default_tier)


ARRAY_FIELDS = ("array", "array_params", "array_grid")


def interactive_errors(attrs: dict) -> None:
    """An interactive job runs shells, not a template nor an array; an idle timeout is for one."""
    if not attrs.get("interactive"):
        if "idle_timeout_minutes" in attrs:
            raise serializers.ValidationError(
                {"idle_timeout_minutes": ["only for an interactive job"]}
            )
        return
    for name in ("template", *ARRAY_FIELDS):
        if attrs.get(name) is not None:
            raise serializers.ValidationError({name: ["not for an interactive job"]})


def _array_fields(attrs: dict, template: JobTemplate | None) -> dict:
    """The array's validated fields: `array` an ArraySpec (from the body's spec, or "0-(n-1)"
    when it was left out and `array_params` or `array_grid` gives the size n), its params list
    or grid, each task's params checked against the template's schema. Errors name the field."""

    def refuse(error: arrayspec.ArraySpecError):
        raise serializers.ValidationError({error.field: [error.message]}) from None

    params, grid = attrs.get("array_params"), attrs.get("array_grid")
    if params is not None and grid is not None:
        raise serializers.ValidationError(
            {"array_grid": ["give array_params or array_grid, not both"]}
        )
    try:
        size = None
        if grid is not None:
            size = arrayspec.grid_size(grid)
        elif params is not None:
            size = arrayspec.check_params_list(params, None)
        if "array" in attrs:
            spec = arrayspec.parse(attrs["array"], max_tasks=settings.MAX_ARRAY_TASKS)
        elif size is not None:
            spec = arrayspec.parse(f"0-{size - 1}", max_tasks=settings.MAX_ARRAY_TASKS)
        if size is not None and size != spec.size:
            field = "array_grid" if grid is not None else "array_params"
            raise arrayspec.ArraySpecError(
                f"gives {size} tasks but the array has {spec.size}: they must match", field=field
            )
    except arrayspec.ArraySpecError as error:
        refuse(error)
    base = attrs.get("params", {})
    schema = template.params_schema if template is not None else None
    if grid is not None and schema is not None:
        errors = {}
        for name, values in grid.items():
            for value in values:
                try:
                    validate_params(schema, {**base, name: value})
                except ParamsError as error:
                    errors[name] = [error.errors.get(name) or next(iter(error.errors.values()))]
                    break
        if errors:
            raise serializers.ValidationError({"array_grid": errors})
    if params is not None and schema is not None:
        for position, item in enumerate(params):
            try:
                validate_params(schema, {**base, **item})
            except ParamsError as error:
                raise serializers.ValidationError(
                    {"array_params": {f"[{position}].{k}": [v] for k, v in error.errors.items()}}
                ) from None
    return {"array": spec, "array_params": params or [], "array_grid": grid or {}}


def spec_from(data: dict, *, default_tier: Tier) -> JobSpec:
    """The JobSpec of validated submit data. The fields whose defaults come from the template,
    the command or the tenant are worked out here; every other field of the spec is the body's
    field of that name (default: the serializer field's, else the spec's), so a new plain field
    needs no line here."""
    template = data.get("template")
    command: list[str] = data.get("command") or []  # validated: a template, a command, an image
    image = data.get("image") or ""
    if template is None and not command and image:  # the image's own Cmd (docs/images.md)
        default_name = image.split("@", 1)[0].rsplit("/", 1)[-1].split(":", 1)[0]
    elif template is None and not command:  # an interactive job's login shell
        default_name = "shell"
    else:
        default_name = template.name if template else command_name(command)
    derived = {
        "name": data.get("name") or default_name[:100],
        "tier": data.get("tier") or default_tier,
        "template": template,
        "params": data.get("params", {}),
        # An image without a command runs its own Cmd: `[]`, still a command (allow_commands).
        "command": data.get("command") if template is not None or not image else command,
        "gpu_sku": data.get("gpu_sku"),
        "max_runtime_seconds": data.get("max_runtime_seconds")
        or (template.default_max_runtime_seconds if template else 3600),
        "checkpointable": data.get(
            "checkpointable", template.checkpointable if template else False
        ),
        "cacheable": data.get("cacheable", template.cacheable if template else False),
        **{
            name: data.get(name) or (getattr(template, name) if template else 0)
            for name in LIMIT_FIELDS
        },
    }
    plain = {name: data[name] for name in SPEC_FIELDS if name not in derived and name in data}
    return JobSpec(**derived, **plain)


_built = threading.local()  # per thread: one built serializer of each kind


def validate_submission(data, *, named: dict | None = None) -> dict:
    """`JobSubmitSerializer(data=data)`'s validated data, raising the same ValidationError as
    `is_valid(raise_exception=True)`, without building the serializer's fields for every submit
    (deep copies of its 13 declared fields, ~0.5 ms): each thread keeps one built serializer,
    whose fields hold nothing of a request."""
    serializer = getattr(_built, "submit", None)
    if serializer is None:
        serializer = _built.submit = JobSubmitSerializer()
        serializer.fields  # noqa: B018 (build and bind them once)
    serializer.named = named or {}  # the template and SKU read already, if any
    try:
        return serializer.run_validation(data)
    except serializers.ValidationError as error:
        raise serializers.ValidationError(error.detail) from None
    finally:
        serializer.named = {}


class AttemptSerializer(serializers.ModelSerializer):
    placements = serializers.SerializerMethodField()
    placed_at = serializers.DateTimeField(source="created_at")

    class Meta:
        model = JobAttempt
        fields = ["number", "state", "placements", "placed_at", "started_at", "ended_at", "exit_code", "reason",
                  "checkpoint"]  # fmt: skip

    def get_placements(self, attempt: JobAttempt) -> list[dict]:
        return [
            {"node": m.node.name, "gpu_indices": m.gpu_indices, "rank": m.rank}
            for m in attempt.members.all()
        ]


class JobSerializer(serializers.ModelSerializer):
    tenant = serializers.CharField(source="tenant.slug")
    user = serializers.CharField(source="user.username")
    tier = serializers.CharField(source="tier.name")
    gpu_sku = serializers.CharField(source="gpu_sku.name", allow_null=True, default=None)
    template = serializers.CharField(source="template.name", allow_null=True, default=None)
    queue_position = serializers.SerializerMethodField()
    estimated_start_at = serializers.SerializerMethodField()
    estimated_start_window = serializers.SerializerMethodField()
    attempts = AttemptSerializer(many=True)
    depends_on = serializers.SerializerMethodField()

    class Meta:
        model = Job
        fields = [
            "id", "name", "tenant", "user", "tier", "state", "progress", "gpus", "nodes", "gpu_sku",
            "node_selector", "template", "params", "command", "max_runtime_seconds", "checkpointable",
            "cacheable", "created_at", "started_at", "finished_at", "queue_position",
            "estimated_start_at", "estimated_start_window", "reason", "cache_hit", "exit_code", "attempts", "retry_on_failure",
            "not_before", "memory_mib", "pids_max", "cpu_weight", "bundle", "env", "secrets", "python",
            "array", "array_index", "depends_on", "image", "image_pull_secret", "image_digest",
            "interactive", "idle_timeout_minutes",
        ]  # fmt: skip

    @extend_schema_field(
        {"type": "array", "items": {"type": "object", "properties": {
            "job": {"type": "string"}, "condition": {"type": "string"},
            "state": {"type": "string", "enum": ["pending", "satisfied", "never"]}}}}
    )  # fmt: skip
    def get_depends_on(self, job: Job) -> list[dict]:
        """As submitted, each with its state (apps/jobs/dependencies.py)."""
        return dependencies.depends_on(job)

    def to_representation(self, instance):
        data = super().to_representation(instance)
        if data.get("state") == JobState.QUEUED and data.get("reason"):
            data["reason"] = waiting.with_relative(data["reason"])  # "... (in ~12 min)"
        return data

    @extend_schema_field({"type": "array", "items": {"type": "string", "format": "date-time",
                          "nullable": True}, "nullable": True})  # fmt: skip
    def get_estimated_start_window(self, job: Job):
        """[earliest, latest] from the dispatcher's plan (apps/scheduling/plan.py); null without
        one (latest null when the late run of the plan could not say)."""
        if job.state != JobState.QUEUED or job.planned_at is None or not job.planned_start_at:
            return None
        field = serializers.DateTimeField()
        earliest, latest = job.planned_start_earliest, job.planned_start_latest
        return [field.to_representation(earliest) if earliest else None,
                field.to_representation(latest) if latest else None]  # fmt: skip

    def get_queue_position(self, job: Job) -> int | None:
        if job.state == JobState.QUEUED and job.planned_at is not None and job.planned_position:
            return job.planned_position  # the plan's order (apps/scheduling/plan.py)
        positions = self.context.get("queue_positions")
        if positions is not None:
            return positions.get(job.pk)
        return queue_position(job)

    @extend_schema_field({"type": "string", "format": "date-time", "nullable": True})
    def get_estimated_start_at(self, job: Job):
        """From the queue ahead, capacity and running jobs' expected ends (apps/admission/estimates.py).
        One estimator per response: a list shares it across its jobs."""
        if job.state != "queued" or job.held_by_dependencies:
            return None
        if job.planned_at is not None:  # the dispatcher's plan, as stored (apps/scheduling/plan.py)
            start = job.planned_start_at
            return serializers.DateTimeField().to_representation(start) if start else None
        # Until the first plan that includes the job (the pass its submit asks for): the replay.
        if "estimator" not in self.context:
            self.context["estimator"] = Estimator.load()
        estimate = self.context["estimator"].estimate(job)
        return serializers.DateTimeField().to_representation(estimate) if estimate else None


def _column(field: serializers.Field, columns: set[str]) -> str | None:
    """The Job column a field's value is, where DRF's `get_attribute` would find it by one
    `getattr` (a plain field whose source is the column); None otherwise."""
    if isinstance(field, serializers.SerializerMethodField | serializers.RelatedField):
        return None
    if isinstance(field, serializers.BaseSerializer | serializers.ManyRelatedField):
        return None
    source = field.source_attrs
    return source[0] if len(source) == 1 and source[0] in columns else None


class CreatedJobSerializer(JobSerializer):
    """JobSerializer for a job a submit has just created: the same fields (declared once, in
    JobSerializer), but a new job has no attempts (reading them would be a statement) and its
    queue position and start estimate are computed by the caller (`created_representation`).
    tests/admission/test_rows.py holds the 201 equal to JobSerializer's answer for queued,
    command, no-SKU and cache-hit jobs."""

    # A declared field redeclared as another kind, as DRF allows (the stubs type it as the base's).
    attempts = serializers.SerializerMethodField()  # type: ignore[assignment]
    position: int | None = None
    start = None
    readable_plan: list | None = None  # `plan()`'s, once made

    def get_attempts(self, job: Job) -> list:
        return []

    def to_representation(self, instance):
        """DRF's `Serializer.to_representation` (every readable field in order: a None stays None,
        anything else through the field's `to_representation`), then JobSerializer's wording of
        a queued job's reason. What differs is how a value is found: for a field whose source
        is one of Job's own columns, `getattr` on the job, where DRF's `Field.get_attribute`
        walks a source path that has one step here, checks for a mapping and for a callable
        (a column's value is neither) and catches what a missing attribute raises (a column is
        never missing): ~1 us a field, 33 of the 44 fields. The others (related names, the
        method fields, the array's key) go through DRF's own `get_attribute`."""
        ret = {}
        for name, column, field in self.plan():
            if column is None:
                try:
                    attribute = field.get_attribute(instance)
                except SkipField:
                    continue
                none = (attribute.pk if isinstance(attribute, PKOnlyObject) else attribute) is None
            else:
                attribute = getattr(instance, column)
                none = attribute is None
            ret[name] = None if none else field.to_representation(attribute)
        if ret.get("state") == JobState.QUEUED and ret.get("reason"):
            ret["reason"] = waiting.with_relative(ret["reason"])  # as JobSerializer's
        return ret

    def plan(self) -> list[tuple[str, str | None, serializers.Field]]:
        """(key, the Job column it reads or None, field) for each readable field, in order; made
        once for this serializer (one a thread: `created_representation`)."""
        plan = self.readable_plan
        if plan is None:
            columns = {f.name for f in Job._meta.concrete_fields if not f.is_relation}
            plan = self.readable_plan = [
                (field.field_name, _column(field, columns), field)
                for field in self.fields.values()
                if not field.write_only
            ]
        return plan

    def get_queue_position(self, job: Job) -> int | None:
        return self.position

    def get_estimated_start_at(self, job: Job):
        return serializers.DateTimeField().to_representation(self.start) if self.start else None


def created_representation(job: Job, *, position: int | None, start) -> dict:
    """`JobSerializer(job).data` of a job a submit has just created, with its queue position and
    start estimate as given. One built serializer per thread: building its fields (deep copies
    of the declared ones) for every answer was most of its cost."""
    serializer = getattr(_built, "created", None)
    if serializer is None:
        serializer = _built.created = CreatedJobSerializer()
        serializer.fields  # noqa: B018 (build and bind them once)
    serializer.position, serializer.start = position, start
    try:
        return serializer.to_representation(job)
    finally:
        serializer.position = serializer.start = None


class ArtifactSerializer(serializers.ModelSerializer):
    url = serializers.SerializerMethodField()

    class Meta:
        model = Artifact
        fields = ["name", "size", "sha256", "created_at", "url"]

    def get_url(self, artifact: Artifact) -> str:
        return f"/api/v1/jobs/{artifact.job_id}/artifacts/{artifact.name}"


# --- job arrays (docs/arrays.md) ------------------------------------------------------------------


class ArraySerializer(serializers.ModelSerializer):
    """A job array: its tasks counted by state (virtual ones included), progress, where they
    are listed. `state`: active (tasks to run or running), ended (every task ended), cancelled."""

    tenant = serializers.CharField(source="tenant.slug")
    user = serializers.CharField(source="user.username")
    tier = serializers.CharField(source="tier.name")
    array = serializers.CharField(source="spec")
    state = serializers.SerializerMethodField()
    counts = serializers.SerializerMethodField()
    progress = serializers.SerializerMethodField()
    tasks_url = serializers.SerializerMethodField()

    class Meta:
        model = JobArray
        ref_name = "JobArray"
        fields = ["id", "name", "tenant", "user", "tier", "array", "size", "throttle", "state", "counts",
                  "progress", "materialised", "tasks_url", "created_at", "cancelled_at", "ended_at"]  # fmt: skip

    def _counts(self, array: JobArray) -> dict[str, int]:
        cache = self.context.setdefault("array_counts", {})
        if array.pk not in cache:
            cache[array.pk] = array_tasks.counts(array)
        return cache[array.pk]

    def get_state(self, array: JobArray) -> str:
        if array.cancelled_at is not None:
            return "cancelled"
        return "ended" if array.ended_at is not None else "active"

    @extend_schema_field(
        {"type": "object", "additionalProperties": {"type": "integer"}, "example": {"queued": 9}}
    )
    def get_counts(self, array: JobArray) -> dict[str, int]:
        return self._counts(array)

    def get_progress(self, array: JobArray) -> float:
        return round(array_tasks.progress(array, self._counts(array)), 4)

    def get_tasks_url(self, array: JobArray) -> str:
        return f"/api/v1/jobs/?array={array.pk}"


class CreatedArraySerializer(ArraySerializer):
    """ArraySerializer for an array a submit has just created, with no dependencies: every task
    is queued, so its counts need no statement (`created_array_representation`)."""

    def _counts(self, array: JobArray) -> dict[str, int]:
        return {s: (array.size if s == JobState.QUEUED else 0) for s in JobState.values}


def created_array_representation(array: JobArray) -> dict:
    """`ArraySerializer(array).data` of an array a submit has just created, with no dependencies
    (tests/admission/test_arrays.py holds it equal to a GET of the array). One built serializer
    per thread, as `created_representation`."""
    serializer = getattr(_built, "created_array", None)
    if serializer is None:
        serializer = _built.created_array = CreatedArraySerializer()
        serializer.fields  # noqa: B018 (build and bind them once)
    return serializer.to_representation(array)


_DATETIME = serializers.DateTimeField()


def virtual_representation(task: array_tasks.VirtualTask) -> dict:
    """A task without a row yet, in JobSerializer's shape: queued (cancelled once its array is),
    no attempts, its id the one its row will take. What all of an array's tasks share is built
    once per array instance (a listing page shares one)."""
    array = task.array
    shared = getattr(array, "_task_shape", None)
    if shared is None:
        shared = array._task_shape = _task_shape(array)  # type: ignore[attr-defined]
    out = dict(shared)
    del out["_created"]
    out["id"] = array_tasks.task_id_text(array.pk.bytes, task.index)
    out["array_index"] = task.index
    # As DateTimeField shows it (the current time zone, "Z" for UTC), without its per-value work.
    created = (shared["_created"] + timedelta(microseconds=task.position)).isoformat()
    out["created_at"] = created[:-6] + "Z" if created.endswith("+00:00") else created
    if array.params or array.grid:
        out["params"] = task_params(shared["params"], array.params, array.grid, task.position)
    if array.has_dependencies:  # docs/pipelines.md
        out["depends_on"] = dependencies.task_depends_on(array, task.index)
    return out


def _task_shape(array: JobArray) -> dict:
    fields = array.task
    template = JobTemplate.objects.filter(pk=fields.get("template_id")).first()
    sku = GpuSku.objects.filter(pk=fields.get("gpu_sku_id")).first()
    cancelled = array.cancelled_at
    return {
        "_created": _DATETIME.enforce_timezone(array_tasks.anchor(array)),
        "id": None, "name": fields.get("name", array.name), "tenant": array.tenant.slug,
        "user": array.user.username, "tier": array.tier.name, "state": array_tasks.virtual_state(array),
        "progress": 0.0, "gpus": fields.get("gpus"), "nodes": fields.get("nodes"),
        "gpu_sku": sku.name if sku else None, "node_selector": fields.get("node_selector") or {},
        "template": template.name if template else None, "params": fields.get("params") or {},
        "command": fields.get("command"), "max_runtime_seconds": fields.get("max_runtime_seconds"),
        "checkpointable": fields.get("checkpointable"), "cacheable": fields.get("cacheable"),
        "created_at": None, "started_at": None,
        "finished_at": _DATETIME.to_representation(ended) if (ended := (
            cancelled or (array.ended_at if array.failed_reason else None))) else None,
        "queue_position": None, "estimated_start_at": None, "estimated_start_window": None,
        "reason": array.failed_reason if array.failed_reason else "array cancelled" if cancelled else
        dependencies.array_waiting_reason(array) if array.held_by_dependencies else
        "waiting: a task of its array, to be queued as a job when the dispatcher can start it",
        "cache_hit": False, "exit_code": None, "attempts": [],
        "retry_on_failure": fields.get("retry_on_failure", False), "not_before": None,
        "memory_mib": fields.get("memory_mib", 0), "pids_max": fields.get("pids_max", 0),
        "cpu_weight": fields.get("cpu_weight", 0), "array": str(array.pk), "array_index": None,
        "depends_on": [],  # per task (aftercorr's state is its index's): virtual_representation
    }  # fmt: skip
