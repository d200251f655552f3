"""Validate a template's parameters against its schema.

A schema is a flat mapping of parameter name to {"type": integer|number|string|boolean,
"minimum", "maximum", "max_length", "default", "required"}. Errors name the parameter, so the
API can answer 400 with `params.<name>`.
"""

from typing import Any

TYPES = {"integer", "number", "string", "boolean"}


class ParamsError(Exception):
    def __init__(self, errors: dict[str, str]):
        super().__init__(errors)
        self.errors = errors


def validate_params(schema: dict[str, dict], params: Any) -> dict:
    """Return the parameters with defaults filled in, or raise ParamsError."""
    if not isinstance(params, dict):
        raise ParamsError({"params": "must be a JSON object"})
    errors = {name: "unknown parameter" for name in params if name not in schema}
    clean = {}
    for name, spec in schema.items():
        if name not in params:
            if spec.get("required"):
                errors[name] = "this parameter is required"
            elif "default" in spec:
                clean[name] = spec["default"]
            continue
        problem = _check(spec, params[name])
        if problem:
            errors[name] = problem
        else:
            clean[name] = params[name]
    if errors:
        raise ParamsError(errors)
    return clean


def _check(spec: dict, value: Any) -> str | None:
    kind = spec.get("type", "string")
    if kind == "integer" and (isinstance(value, bool) or not isinstance(value, int)):
        return "must be an integer"
    if kind == "number" and (isinstance(value, bool) or not isinstance(value, int | float)):
        return "must be a number"
    if kind == "string" and not isinstance(value, str):
        return "must be a string"
    if kind == "boolean" and not isinstance(value, bool):
        return "must be true or false"
    if kind in ("integer", "number"):
        if value != value or value in (float("inf"), float("-inf")):
            return "must be a finite number"
        if "minimum" in spec and value < spec["minimum"]:
            return f"must be at least {spec['minimum']}"
        if "maximum" in spec and value > spec["maximum"]:
            return f"must be at most {spec['maximum']}"
    if kind == "string" and len(value) > spec.get("max_length", 10_000):
        return f"must be at most {spec.get('max_length', 10_000)} characters"
    return None


def validate_schema(schema: Any) -> None:
    """Check a template's schema itself (admin form validation)."""
    if not isinstance(schema, dict):
        raise ParamsError({"params_schema": "must be an object of parameter specs"})
    for name, spec in schema.items():
        if not isinstance(spec, dict) or spec.get("type", "string") not in TYPES:
            raise ParamsError({name: f"type must be one of {sorted(TYPES)}"})
