"""`python manage.py set_tier NAME [--gpu-idle-warn-minutes N] [--gpu-idle-minutes N]
[--gpu-idle-action none|requeue|cancel] [--interactive-idle-minutes N] [--min-runtime-seconds N]`:
change a tier's settings; prints the tier as JSON (docs/telemetry.md for the idle ones)."""

import json

from django.core.management.base import BaseCommand, CommandError
from django.forms.models import model_to_dict

from apps.tenants import token_cache
from apps.tenants.models import IdleAction, Tier

OFF = ("off", "none", "never")


def minutes(text: str) -> int | None:
    """A whole number of minutes, or `off` (never)."""
    if text.strip().lower() in OFF:
        return None
    if not text.strip().isdigit():
        raise ValueError(text)
    return int(text)


def count(text: str) -> int:
    if not text.strip().isdigit():
        raise ValueError(text)
    return int(text)


class Command(BaseCommand):
    help = "Change a tier's settings (idle GPUs, interactive idle timeout, minimum runtime); prints it as JSON."

    def add_arguments(self, parser):
        parser.add_argument("name")
        parser.add_argument("--gpu-idle-warn-minutes", type=minutes, metavar="N|off",
                            default=..., help="warn once every GPU of a job sat idle this long")  # fmt: skip
        parser.add_argument("--gpu-idle-minutes", type=minutes, metavar="N|off", default=...,
                            help="act once every GPU of a job sat idle this long")  # fmt: skip
        parser.add_argument("--gpu-idle-action", choices=IdleAction.values, default=None)
        parser.add_argument("--interactive-idle-minutes", type=count, metavar="N", default=None)
        parser.add_argument("--min-runtime-seconds", type=count, metavar="N", default=None)

    def handle(self, name, **options):
        tier = Tier.objects.filter(name=name).first()
        if tier is None:
            known = ", ".join(Tier.objects.values_list("name", flat=True))
            raise CommandError(f"unknown tier {name!r} (there are: {known})")
        changed = []
        for field in ("gpu_idle_warn_minutes", "gpu_idle_minutes"):
            if options[field] is not ...:
                setattr(tier, field, options[field])
                changed.append(field)
        for field in ("gpu_idle_action", "interactive_idle_minutes", "min_runtime_seconds"):
            if options[field] is not None:
                setattr(tier, field, options[field])
                changed.append(field)
        if tier.interactive_idle_minutes < 1:
            raise CommandError("--interactive-idle-minutes must be at least 1")
        if changed:
            tier.save(update_fields=changed)
            token_cache.tenants_changed(tier_ids=[tier.pk])
        self.stdout.write(json.dumps(model_to_dict(tier), indent=2, default=str))
