import json

from django.core.management.base import BaseCommand, CommandError

from apps.tenants.models import Tenant
from apps.tenants.services import quota_set


def sku_limit(text: str) -> tuple[str, int]:
    sku, sep, count = text.partition("=")
    if not sep or not sku or not count.isdigit():
        raise CommandError(f"--max-gpus wants SKU=N, got {text!r}")
    return sku, int(count)


class Command(BaseCommand):
    help = "Set a tenant's own limits (overriding its tier's); prints them as JSON."

    def add_arguments(self, parser):
        parser.add_argument("slug")
        parser.add_argument("--max-queued-jobs", type=int)
        parser.add_argument("--max-gpus", nargs="*", default=[])
        parser.add_argument("--submit-rate", type=int)
        parser.add_argument("--submit-burst", type=int)
        parser.add_argument("--gpu-hours-per-period", type=int)

    def handle(
        self,
        slug,
        max_queued_jobs,
        max_gpus,
        submit_rate,
        submit_burst,
        gpu_hours_per_period,
        **options,
    ):
        tenant = Tenant.objects.filter(slug=slug).select_related("tier").first()
        if tenant is None:
            raise CommandError(f"unknown tenant {slug!r}")
        for value in (max_queued_jobs, submit_rate, submit_burst, gpu_hours_per_period):
            if value is not None and value < 0:
                raise CommandError("limits must not be negative")
        quota = quota_set(
            tenant=tenant, max_queued_jobs=max_queued_jobs, max_gpus=dict(sku_limit(t) for t in max_gpus),
            submit_rate_per_minute=submit_rate, submit_burst=submit_burst, gpu_hours_per_period=gpu_hours_per_period,
        )  # fmt: skip
        quota.tenant = tenant
        self.stdout.write(json.dumps({"tenant": slug, **quota.effective()}, indent=2))
