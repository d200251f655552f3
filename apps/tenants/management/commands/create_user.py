from django.core.management.base import BaseCommand, CommandError

from apps.tenants.services import TenantError, user_create


class Command(BaseCommand):
    help = "Create or update a user in a tenant; with --token prints its API token as the last line."

    def add_arguments(self, parser):
        parser.add_argument("username")
        parser.add_argument("--tenant")
        parser.add_argument("--role", default="member", choices=["admin", "member", "viewer"])
        parser.add_argument("--staff", action="store_true")
        parser.add_argument("--password")
        parser.add_argument("--token", action="store_true")

    def handle(self, username, tenant, role, staff, password, token, **options):
        if not tenant and not staff:
            raise CommandError("give --tenant SLUG (or --staff for support staff)")
        try:
            user, key = user_create(username=username, tenant_slug=tenant, role=role, staff=staff, password=password)
        except TenantError as error:
            raise CommandError(str(error)) from None
        self.stdout.write(f"user {user.username} tenant={tenant or '-'} role={role} staff={staff}")
        if token:
            self.stdout.write(key)
