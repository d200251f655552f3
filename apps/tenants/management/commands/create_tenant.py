from django.core.management.base import BaseCommand, CommandError

from apps.tenants.services import TenantError, tenant_create


class Command(BaseCommand):
    help = "Create or update a tenant."

    def add_arguments(self, parser):
        parser.add_argument("slug")
        parser.add_argument("--tier", required=True)
        parser.add_argument("--allow-commands", action="store_true")
        parser.add_argument("--name", default="")

    def handle(self, slug, tier, allow_commands, name, **options):
        try:
            tenant = tenant_create(
                slug=slug, tier_name=tier, allow_commands=allow_commands, name=name
            )
        except TenantError as error:
            raise CommandError(str(error)) from None
        self.stdout.write(f"tenant {tenant.slug} ({tenant.tier.name})")
