"""The OpenAPI document's honest half: what drf-spectacular cannot see from the views.

Client generators and fuzzers read `/api/schema/`, so it must say what the API really answers:
- only the public API (`/api/v1/`): the agent API (`/internal/agent/v1/`), the pages and the
  schema view itself are not in it (`public_only`, a preprocessing hook);
- every operation's error answers, with the bodies apps/jobs/api_errors.py really writes
  (`{"<field>": ["message"]}`, DRF's `{"detail": "..."}`) and `Retry-After` on a 429;
- the submit body's rule "exactly one of template or command" as a `oneOf`, one shape per
  template in the database (its params as JSON Schema) and one for a command, with the tiers
  and GPU SKUs of the database as enums, and examples the server accepts.

The enums are read when the document is generated (each request to `/api/schema/`); without a
database (`manage.py spectacular` before `migrate`) the document is the same, without them.
"""

from __future__ import annotations

import copy
import re
from typing import Any

from django.conf import settings
from django.db import DatabaseError

PUBLIC_PREFIX = "/api/v1/"
SUBMIT = ("/api/v1/jobs/", "post")
ID_OR_PREFIX = "^[0-9a-fA-F-]{8,36}$"  # a job's or array's id, or a prefix (apps/jobs/lookup.py)
ENV_NAME = "^[A-Z_][A-Z0-9_]*$"  # apps/platform/own_code.py (reserved names are 400s)
NO_CONTROL = (
    "^[^\\u0000-\\u001f]*$"  # apps/jobs/fields.py: StrictCharField refuses control characters
)

# --- components --------------------------------------------------------------------------------

MESSAGES = {"type": "array", "items": {"type": "string"}, "minItems": 1}
COMPONENTS: dict[str, dict] = {
    "Detail": {
        "type": "object",
        "description": "DRF's own refusals: no or a bad token, not allowed, not found.",
        "properties": {"detail": {"type": "string"}},
        "required": ["detail"],
        "example": {"detail": "Not found."},
    },
    "FieldErrors": {
        "type": "object",
        "description": (
            "Per-field messages: each key names the field at fault (`body` for a malformed body, "
            "`detail` for a refusal of the whole request); a template's `params` nest one level."
        ),
        "additionalProperties": {
            "anyOf": [MESSAGES, {"type": "object", "additionalProperties": MESSAGES}],
        },
        "minProperties": 1,
        "example": {
            "gpus": ["must be an integer"],
            "params": {"steps": ["must be at most 100000"]},
        },
    },
}
REF = {name: {"$ref": f"#/components/schemas/{name}"} for name in COMPONENTS}
EITHER = {"anyOf": [REF["Detail"], REF["FieldErrors"]]}

RETRY_AFTER = {
    "Retry-After": {
        "required": True,
        "description": "Whole seconds to wait before trying again.",
        "schema": {"type": "integer", "minimum": 0},
    }
}
RATE_HEADERS = {
    name: {"description": text, "schema": {"type": "string"}}
    for name, text in [
        ("X-RateLimit-Limit", "the binding rate bucket's size"),
        ("X-RateLimit-Remaining", "whole submits left in it"),
        ("X-RateLimit-Reset", "seconds until it is full again"),
        ("X-RateLimit-Degraded", "set when Redis is down and the tier fails open"),
    ]
}


def _answer(description: str, schema: dict, headers: dict | None = None) -> dict:
    answer: dict[str, Any] = {
        "description": description,
        "content": {"application/json": {"schema": schema}},
    }
    if headers:
        answer["headers"] = headers
    return answer


ERRORS = {
    "400": _answer("Bad input: each field at fault with its messages.", REF["FieldErrors"]),
    "401": _answer("No token, or an unknown, expired or revoked one.", REF["Detail"]),
    "403": _answer(
        "Understood and not allowed (role, tier, commands, staff only, GPU-hours).", EITHER
    ),
    "404": _answer(
        "No such object for the caller (another tenant's job is not found either).", REF["Detail"]
    ),
    "405": _answer("This method is not allowed here.", REF["Detail"]),
    "406": _answer("No representation that the Accept header allows.", REF["Detail"]),
    "409": _answer("This Idempotency-Key was used with a different body.", REF["FieldErrors"]),
    "413": _answer("The request body is larger than the server takes.", EITHER),
    "415": _answer("The body's Content-Type is not JSON.", REF["Detail"]),
    "429": _answer(
        "Over a rate limit, the queued-job cap or the open-stream cap.", EITHER, RETRY_AFTER
    ),
    "503": _answer(
        "Admission is unavailable (Redis down, and the tenant's tier fails closed).",
        EITHER,
        RETRY_AFTER,
    ),
}


def errors_for(path: str, method: str, operation: dict) -> list[str]:
    """The error statuses an operation can answer (apps/jobs/api_errors.py, DRF's handler)."""
    codes = [
        "401",
        "403",
        "406",
    ]  # any token may be bad; session auth wants CSRF; Accept negotiates
    params = operation.get("parameters", [])
    if operation.get("requestBody") or any(p.get("in") == "query" for p in params):
        codes.append("400")
    if any(p.get("in") == "path" for p in params) or any(p.get("name") == "page" for p in params):
        codes.append("404")  # an unknown id; a page past the last one
    body_types = set(operation.get("requestBody", {}).get("content", {}))
    if body_types:
        codes.append("415")
    if body_types - {"application/json"}:
        codes.append(
            "413"
        )  # an upload over its cap (JSON bodies are refused by their fields' limits)
    if (path, method) == SUBMIT:
        codes += ["404", "409", "429", "503"]  # 404: a `depends_on` id the caller cannot see
    if path.endswith(("/cancel/", "/requeue-failed/")):
        codes.append("400")  # a state the change does not apply to (already ended, cancelled)
    if path.endswith("/events/"):
        codes.append("429")  # the open-stream caps
    if "{id}" in path and path.startswith(("/api/v1/jobs/", "/api/v1/arrays/")):
        codes.append("400")  # an id prefix that more than one of the tenant's ids start with
    if path.endswith("/sessions/"):
        codes += ["409", "429"]  # a job not running; the session caps (gpuplatform/sessions_api.py)
    return list(dict.fromkeys(codes))


# --- hooks -------------------------------------------------------------------------------------


def public_only(endpoints, **kwargs):
    """Preprocessing hook: the public API only (not the agent API, the pages, the schema view)."""
    return [endpoint for endpoint in endpoints if endpoint[0].startswith(PUBLIC_PREFIX)]


def honest_document(result, generator, request, public):
    """Postprocessing hook: error answers, path parameter formats, the submit body's one-of."""
    schemas = result.setdefault("components", {}).setdefault("schemas", {})
    schemas.update(copy.deepcopy(COMPONENTS))
    catalog = _catalog()
    for path, operations in result.get("paths", {}).items():
        for method, operation in operations.items():
            _type_path_parameters(path, operation)
            _type_query_parameters(operation, catalog)
            responses = operation.setdefault("responses", {})
            for code in errors_for(path, method, operation):
                responses.setdefault(code, copy.deepcopy(ERRORS[code]))
            if path.endswith("/events/"):
                _errors_as_events(responses)
            if (path, method) == SUBMIT:
                responses["404"] = _answer(
                    "A `depends_on` id the caller cannot see (another tenant's, or none).",
                    REF["FieldErrors"],
                )
                _submit(operation, schemas, catalog)
    _enums(schemas, catalog)
    return result


def sse_event(kinds: list[str], description: str) -> dict:
    """One Server-Sent Event as a reader parses it (`event`, `data`, `id`, `retry` lines)."""
    return {
        "type": "object",
        "description": description,
        "properties": {
            "event": {"type": "string", "enum": kinds},
            "data": {"type": "string", "description": "a JSON object"},
            "id": {"type": "string", "description": "the cursor to resume from (Last-Event-ID)"},
            "retry": {"type": "integer"},
        },
    }


def _errors_as_events(responses: dict) -> None:
    """The stream's events (apps/jobs/events_api.py); its refusals come as one `error` event to a
    client that asked for `text/event-stream` (EventStreamRenderer), else as JSON."""
    for code, answer in responses.items():
        content = answer.setdefault("content", {})
        if code.startswith(("4", "5")):
            content["text/event-stream"] = {"schema": sse_event(["error"], "data: the JSON body")}
        elif content.get("text/event-stream", {}).get("schema", {}).get("type") == "string":
            content["text/event-stream"]["schema"] = sse_event(
                ["state", "progress", "log", "end"], "state changes, progress, log lines, then end"
            )


def _type_query_parameters(operation: dict, catalog: dict) -> None:
    """Pages count from 1 (a page past the last is a 404); `?tier=` names a tier."""
    for parameter in operation.get("parameters", []):
        if parameter.get("in") != "query":
            continue
        if parameter["name"] == "page":
            parameter["schema"] = {**parameter.get("schema", {}), "minimum": 1}
        elif parameter["name"] == "tier" and catalog["tiers"]:
            parameter["schema"] = {"type": "string", "enum": catalog["tiers"]}


def _type_path_parameters(path: str, operation: dict) -> None:
    """Job and array ids are UUIDs, or a unique prefix of one of at least 8 characters; a
    router's `{name}` never holds a slash or a dot."""
    for parameter in operation.get("parameters", []):
        if parameter.get("in") != "path":
            continue
        if parameter["name"] == "id" and path.startswith(("/api/v1/jobs/", "/api/v1/arrays/")):
            parameter["schema"] = {"type": "string", "pattern": ID_OR_PREFIX}
            parameter["description"] = "the id, or a unique prefix of it (at least 8 characters)"
        elif parameter["name"] == "name" and path.endswith("/artifacts/{name}"):
            parameter["schema"] = {"type": "string", "minLength": 1}
        elif parameter["name"] == "name":
            parameter["schema"] = {"type": "string", "pattern": "^[^/.]+$"}
        elif parameter["name"] == "sha256":
            parameter["schema"] = {"type": "string", "pattern": "^[0-9a-f]{64}$"}


# --- what the database holds ---------------------------------------------------------------------


def _catalog() -> dict:
    """Templates (name -> params schema), tier and SKU names; empty without a database."""
    from apps.jobs.models import JobTemplate
    from apps.nodes.models import GpuSku
    from apps.tenants.models import Tier

    try:
        return {
            "templates": dict(
                JobTemplate.objects.order_by("name").values_list("name", "params_schema")
            ),
            "tiers": list(Tier.objects.order_by("name").values_list("name", flat=True)),
            "skus": list(GpuSku.objects.order_by("name").values_list("name", flat=True)),
        }
    except DatabaseError:
        return {"templates": {}, "tiers": [], "skus": []}


def _enums(schemas: dict, catalog: dict) -> None:
    """States are enums already (model choices); tiers and SKUs are rows, named here."""
    for name in ("Job",):
        properties = schemas.get(name, {}).get("properties", {})
        if catalog["tiers"] and "tier" in properties:
            properties["tier"] = {**properties["tier"], "enum": catalog["tiers"]}


# --- the submit body ------------------------------------------------------------------------------

TYPES = {"integer": "integer", "number": "number", "string": "string", "boolean": "boolean"}


def params_json_schema(spec: dict) -> dict:
    """A template's params schema (apps/jobs/params.py) as JSON Schema."""
    properties, required = {}, []
    for name, rule in (spec or {}).items():
        kind = TYPES.get(rule.get("type", "string"), "string")
        prop: dict[str, Any] = {"type": kind}
        if kind in ("integer", "number"):
            for key in ("minimum", "maximum"):
                if key in rule:
                    prop[key] = rule[key]
        if kind == "string":
            prop["maxLength"] = rule.get("max_length", 10_000)
        if "default" in rule:
            prop["default"] = rule["default"]
        if rule.get("required"):
            required.append(name)
        properties[name] = prop
    schema: dict[str, Any] = {
        "type": "object",
        "properties": properties,
        "additionalProperties": False,
    }
    if required:
        schema["required"] = required
    return schema


def _common_fields(catalog: dict) -> dict:
    """The submit body's fields beside template/params/command (apps/jobs/serializers.py)."""
    from apps.jobs.serializers import DEPENDS_ON_SCHEMA

    text = {"type": "string", "pattern": NO_CONTROL}
    sku: dict[str, Any] = {"type": "string", "nullable": True, "description": "a GPU SKU's name"}
    if catalog["skus"]:
        sku["enum"] = [*catalog["skus"], None]
    tier: dict[str, Any] = {"type": "string", "description": "default: the tenant's own tier"}
    if catalog["tiers"]:
        tier["enum"] = catalog["tiers"]
    return {
        "name": {
            **text,
            "minLength": 1,
            "maxLength": 100,
            "description": "default: the template's or argv[0]'s",
        },
        "gpus": {
            "type": "integer",
            "minimum": 0,
            "maximum": 64,
            "default": 1,
            "description": "GPUs per node",
        },
        "nodes": {
            "type": "integer",
            "minimum": 1,
            "maximum": 64,
            "default": 1,
            "description": "> 1: a gang",
        },
        "gpu_sku": sku,
        "node_selector": {
            "type": "object",
            "maxProperties": 32,
            "additionalProperties": {**text, "maxLength": 63},
            "description": "labels a node must carry (keys of 1 to 63 characters)",
        },
        "tier": tier,
        "max_runtime_seconds": {
            "type": "integer",
            "minimum": 1,
            "maximum": settings.MAX_RUNTIME_LIMIT_SECONDS,
        },
        "checkpointable": {"type": "boolean"},
        "cacheable": {"type": "boolean"},
        "retry_on_failure": {"type": "boolean", "default": False},
        # A job array (docs/arrays.md): the submit answers with the array instead of a job.
        "array": {
            "type": "string",
            "minLength": 1,
            "maxLength": 1000,
            "pattern": "^[0-9,:%-]+$",
            "description": "Slurm's --array syntax: 0-99, 0-99:2, 1,5,9, then %N (at most N at once)",
        },
        "array_params": {
            "type": "array",
            "minItems": 1,
            "items": {"type": "object"},
            "description": "one params object per task, merged over `params`",
        },
        "array_grid": {
            "type": "object",
            "minProperties": 1,
            "additionalProperties": {"type": "array", "minItems": 1},
            "description": "params name -> values: the product, last key fastest",
        },
        "depends_on": copy.deepcopy(DEPENDS_ON_SCHEMA),
        "secrets": {
            "type": "array",
            "maxItems": 64,
            "uniqueItems": True,
            "items": {"type": "string", "pattern": ENV_NAME, "maxLength": 128},
            "description": "names of the tenant's secrets to set in the job's environment",
        },
    }


def _own_code_fields() -> dict:
    """A command's own-code fields (apps/jobs/own_code.py, docs/own-code.md)."""
    return {
        "bundle": {
            "type": "string",
            "pattern": "^[0-9a-f]{64}$",
            "description": "the sha256 of a bundle uploaded by this tenant (POST /api/v1/bundles/):"
            " the command runs in its unpacked root",
        },
        "env": {
            "type": "object",
            "maxProperties": 64,
            "additionalProperties": {
                "type": "string",
                "maxLength": 4096,
                "pattern": "^[^\\u0000]*$",
            },
            "description": "environment variables: names [A-Z_][A-Z0-9_]*, not the platform's own",
        },
        "python": {
            "type": "object",
            "properties": {
                "requirements": {
                    "type": "array",
                    "maxItems": 200,
                    "items": {"type": "string", "minLength": 1, "maxLength": 1000},
                    "description": "PEP 508 requirements, built into a virtual environment on the node",
                }
            },
            "additionalProperties": False,
        },
    }


def _component_name(template: str) -> str:
    return "TemplateJob_" + re.sub(r"[^A-Za-z0-9._-]", "_", template)


def _submit(operation: dict, schemas: dict, catalog: dict) -> None:
    common = _common_fields(catalog)
    shapes = []
    for name, spec in catalog["templates"].items():
        component = _component_name(name)
        params = params_json_schema(spec)
        schemas[component] = {
            "type": "object",
            "description": f"A job from the template {name!r}.",
            "properties": {
                "template": {"type": "string", "enum": [name]},
                "params": params,
                **common,
            },
            "required": ["template", "params"] if params.get("required") else ["template"],
            "additionalProperties": False,
        }
        shapes.append({"$ref": f"#/components/schemas/{component}"})
    if not shapes:  # no database: any template name
        schemas["TemplateJob"] = {
            "type": "object",
            "properties": {
                "template": {"type": "string", "maxLength": 64},
                "params": {"type": "object"},
                **common,
            },
            "required": ["template"],
            "additionalProperties": False,
        }
        shapes.append({"$ref": "#/components/schemas/TemplateJob"})
    schemas["CommandJob"] = {
        "type": "object",
        "description": "A job running an argv list (only for tenants allowed to run commands).",
        "properties": {
            "command": {
                "type": "array",
                "minItems": 1,
                "maxItems": 256,
                "items": {
                    "type": "string",
                    "minLength": 1,
                    "maxLength": 4096,
                    "pattern": NO_CONTROL,
                },
            },
            **common,
            **_own_code_fields(),
        },
        "required": ["command"],
        "additionalProperties": False,
    }
    shapes.append({"$ref": "#/components/schemas/CommandJob"})
    body = {
        "oneOf": shapes,
        "description": "Exactly one of `template` (with its `params`) or `command`.",
    }
    content = {"schema": body}
    examples = _examples(catalog)
    if examples:
        content["examples"] = examples
    operation["requestBody"] = {"required": True, "content": {"application/json": content}}
    operation.setdefault("parameters", []).append(
        {
            "in": "header",
            "name": "Idempotency-Key",
            "required": False,
            "description": "The same key with the same body answers the same job (200); with another body, 409.",
            "schema": {"type": "string", "maxLength": 255, "pattern": "^[\\x21-\\x7e]+$"},
        }
    )
    for code in ("200", "201", "429"):
        if code in operation["responses"]:
            headers = operation["responses"][code].setdefault("headers", {})
            for name, header in RATE_HEADERS.items():
                headers.setdefault(name, header)
    if "200" not in operation["responses"] and "201" in operation["responses"]:
        replay = copy.deepcopy(operation["responses"]["201"])
        replay["description"] = "An idempotent replay: the job the same key and body made before."
        operation["responses"]["200"] = replay


def _examples(catalog: dict) -> dict:
    """Bodies the server accepts as they are (a fuzzer reading them makes real jobs)."""
    examples = {}
    templates = catalog["templates"]
    if "demo-train" in templates:
        examples["demo-train"] = {
            "summary": "a short checkpointable training loop",
            "value": {
                "name": "example-train",
                "template": "demo-train",
                "params": {"steps": 3, "step_seconds": 0.1},
            },
        }
    if "demo-infer" in templates:
        examples["demo-infer"] = {
            "summary": "a deterministic, cacheable inference",
            "value": {"template": "demo-infer", "params": {"prompt": "hello", "max_tokens": 8}},
        }
    if not examples and templates:
        name = next(iter(templates))
        examples[name] = {"summary": f"the template {name}", "value": {"template": name}}
    return examples
