from django.core.management.base import BaseCommand, CommandError

from apps.tenants.services import TenantError, user_create
from apps.tenants.tokens import TokenError


class Command(BaseCommand):
    help = (
        "Create or update a user in a tenant; with --token prints a new API token as the last line "
        "(replacing the user's token of the same --token-name)."
    )

    def add_arguments(self, parser):
        parser.add_argument("username")
        parser.add_argument("--tenant")
        parser.add_argument("--role", default="member", choices=["admin", "member", "viewer"])
        parser.add_argument(
            "--staff", action="store_true", help="support staff: is_staff, group 'support'"
        )
        parser.add_argument(
            "--superuser", action="store_true", help="an operator with every permission"
        )
        parser.add_argument("--password")
        parser.add_argument("--token", action="store_true")
        parser.add_argument("--token-name", default="cli")
        parser.add_argument(
            "--token-days", type=int, help="days the token lasts (0: never; default: the setting)"
        )

    def handle(
        self,
        username,
        tenant,
        role,
        staff,
        superuser,
        password,
        token,
        token_name,
        token_days,
        **options,
    ):
        if not tenant and not (staff or superuser):
            raise CommandError(
                "give --tenant SLUG (or --staff for support staff, --superuser for an operator)"
            )
        try:
            user, key = user_create(username=username, tenant_slug=tenant, role=role, staff=staff, superuser=superuser,
                                    password=password, token=token_name if token else None,
                                    token_days=token_days)  # fmt: skip
        except (TenantError, TokenError) as error:
            raise CommandError(str(error)) from None
        self.stdout.write(
            f"user {user.username} tenant={tenant or '-'} role={role} staff={user.is_staff} superuser={user.is_superuser}"
        )
        if token:
            self.stdout.write(key)
