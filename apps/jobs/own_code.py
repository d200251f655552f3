"""The submit body's own-code fields (docs/own-code.md): `bundle`, `env`, `secrets`, `python`.

Each is checked for its shape here (the rules in apps/platform/own_code.py); each refusal is a
400 under the field's name whose message names the entry at fault (`env.PATH ...`,
`secrets[1] ...`, `python.requirements[0] ...`). Whether the bundle is the submitter's tenant's,
and whether each secret exists, is checked with the tenant at submit (apps/admission/submit.py
`check_own_code`).
"""

from __future__ import annotations

from django.conf import settings
from drf_spectacular.utils import extend_schema_field
from packaging.requirements import InvalidRequirement, Requirement
from rest_framework import serializers

from apps.platform import images
from apps.platform import own_code as rules


def _clip(text: str, size: int = 60) -> str:
    return repr(text if len(text) <= size else text[:size] + "...")


STRINGS = {"type": "array", "items": {"type": "string"}}


@extend_schema_field({"type": "string", "pattern": "^[0-9a-f]{64}$"})
class BundleDigestField(serializers.Field):
    def to_internal_value(self, data):
        if not isinstance(data, str) or not rules.SHA256.fullmatch(data):
            raise serializers.ValidationError(
                "must be the sha256 of an uploaded bundle: 64 lowercase hex characters"
            )
        return data

    def to_representation(self, value):
        return value


@extend_schema_field({"type": "object", "additionalProperties": {"type": "string"}})
class EnvField(serializers.Field):
    """{"NAME": "value"}: names as rules.name_problem allows, at most MAX_ENV entries, each value
    a string of at most MAX_ENV_VALUE characters without NUL."""

    def to_internal_value(self, data):
        if not isinstance(data, dict):
            raise serializers.ValidationError('must be an object of strings, e.g. {"LR": "3e-4"}')
        if len(data) > rules.MAX_ENV:
            raise serializers.ValidationError(f"at most {rules.MAX_ENV} variables, not {len(data)}")
        errors = []
        for name, value in data.items():
            problem = rules.name_problem(name)
            if problem:
                errors.append(f"env.{name[:80]} {problem}")
            elif not isinstance(value, str):
                errors.append(f"env.{name} must be a string, not {type(value).__name__}")
            elif len(value) > rules.MAX_ENV_VALUE:
                errors.append(f"env.{name} is longer than {rules.MAX_ENV_VALUE} characters")
            elif "\x00" in value:
                errors.append(f"env.{name} must not contain NUL")
        if errors:
            raise serializers.ValidationError(errors)
        return dict(data)

    def to_representation(self, value):
        return value


@extend_schema_field(STRINGS)
class SecretNamesField(serializers.Field):
    """["HF_TOKEN", ...]: the names of tenant secrets (whether they exist is checked at submit)."""

    def to_internal_value(self, data):
        if not isinstance(data, list):
            raise serializers.ValidationError('must be a list of secret names, e.g. ["HF_TOKEN"]')
        if len(data) > rules.MAX_SECRETS:
            raise serializers.ValidationError(f"at most {rules.MAX_SECRETS} secrets")
        errors = []
        for index, name in enumerate(data):
            if not isinstance(name, str):
                errors.append(f"secrets[{index}] must be a string")
            elif problem := rules.name_problem(name):
                errors.append(f"secrets[{index}] {_clip(name)} {problem}")
            elif name in data[:index]:
                errors.append(f"secrets[{index}] {name} is named twice")
        if errors:
            raise serializers.ValidationError(errors)
        return list(data)

    def to_representation(self, value):
        return value


def requirement_problem(text) -> str | None:
    if not isinstance(text, str):
        return "must be a string"
    if not text.strip() or len(text) > rules.MAX_REQUIREMENT:
        return f"must be a requirement of 1 to {rules.MAX_REQUIREMENT} characters"
    if text.lstrip().startswith("-"):
        return "options (-r, -e, --index-url...) are not requirements"
    try:
        requirement = Requirement(text)
    except InvalidRequirement as error:
        return f"is not a PEP 508 requirement: {str(error).splitlines()[0][:200]}"
    if requirement.url:
        return "names a URL or a path: only packages from the node's index are built"
    return None


@extend_schema_field({"type": "object", "properties": {"requirements": STRINGS}})
class PythonField(serializers.Field):
    """{"requirements": ["torch==2.4.0", "numpy>=1.26"]}: PEP 508 requirement strings (no
    options, URLs or paths: the node builds the environment from its operator's index)."""

    def to_internal_value(self, data):
        if not isinstance(data, dict):
            raise serializers.ValidationError('must be an object: {"requirements": [...]}')
        unknown = sorted(set(data) - {"requirements"})
        if unknown:
            raise serializers.ValidationError(
                [f"python.{name[:80]} is not a field (only requirements)" for name in unknown]
            )
        requirements = data.get("requirements", [])
        if not isinstance(requirements, list):
            raise serializers.ValidationError("python.requirements must be a list of strings")
        if len(requirements) > rules.MAX_REQUIREMENTS:
            raise serializers.ValidationError(
                f"python.requirements: at most {rules.MAX_REQUIREMENTS}, not {len(requirements)}"
            )
        errors = [
            f"python.requirements[{index}] {_clip(str(text))} {problem}"
            for index, text in enumerate(requirements)
            if (problem := requirement_problem(text))
        ]
        if errors:
            raise serializers.ValidationError(errors)
        return {"requirements": [text.strip() for text in requirements]}

    def to_representation(self, value):
        return value


@extend_schema_field({"type": "string", "example": "registry.example.com/team/image:tag"})
class ImageField(serializers.Field):
    """`HOST[:PORT]/REPO[:TAG][@sha256:DIGEST]` (docs/images.md) from a registry the platform
    allows (GPUPLATFORM_IMAGE_REGISTRIES): kept as written; the node pulls it."""

    def to_internal_value(self, data):
        try:
            ref = images.parse(data)
        except images.BadReference as error:
            raise serializers.ValidationError(str(error)) from None
        registries = list(settings.IMAGE_REGISTRIES)
        if not images.allowed(ref, registries):
            allowed = ", ".join(registries) if registries else "none: images are not enabled here"
            raise serializers.ValidationError(
                f"registry {ref.host} is not allowed (allowed: {allowed})"
            )
        return data

    def to_representation(self, value):
        return value


@extend_schema_field({"type": "string"})
class PullSecretField(serializers.Field):
    """The name of a tenant secret holding `user:password` for the image's registry (whether
    it exists is checked at submit)."""

    def to_internal_value(self, data):
        if not isinstance(data, str):
            raise serializers.ValidationError("must be a secret's name")
        problem = rules.name_problem(data)
        if problem:
            raise serializers.ValidationError(f"{_clip(data)} {problem}")
        return data

    def to_representation(self, value):
        return value


def own_code_errors(attrs: dict) -> dict:
    """The rules between the fields: a bundle goes with a command (its root is the command's
    working directory), never a template; `env` and `python` are for commands too (a template
    runs the platform's code, which they could change: a package's install runs its code); an
    `env` name may not also be a secret's (the secret would be overwritten or shadow it)."""
    template, command = attrs.get("template"), attrs.get("command")
    errors: dict[str, list[str]] = {}
    if attrs.get("bundle"):
        if template is not None:
            errors["bundle"] = ["give a bundle with a command, not with a template"]
        elif command is None and not attrs.get(
            "interactive"
        ):  # an interactive job's shells run in it
            errors["bundle"] = ["a bundle needs a command to run in it"]
    if template is not None:
        for name in ("env", "python"):
            if attrs.get(name):
                errors[name] = [f"{name} is for commands, not templates"]
    if attrs.get("image"):
        if template is not None:
            errors["image"] = ["an image is for commands, not templates"]
        if (attrs.get("python") or {}).get("requirements"):
            errors["python"] = [
                "python.requirements are not built for an image: install them in the image"
            ]
    elif attrs.get("image_pull_secret"):
        errors["image_pull_secret"] = ["a pull secret goes with an image"]
    shadowed = sorted(set(attrs.get("env") or {}) & set(attrs.get("secrets") or []))
    if shadowed and "env" not in errors:
        errors["env"] = [f"env.{name} is also named in secrets" for name in shadowed]
    return errors
