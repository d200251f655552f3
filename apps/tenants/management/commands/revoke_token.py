from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError

from apps.tenants.tokens import TokenError, active_tokens, token_revoke


class Command(BaseCommand):
    help = (
        "Revoke a user's API token by --name, or --all of them; with neither, list the active ones."
    )

    def add_arguments(self, parser):
        parser.add_argument("username")
        parser.add_argument("--name", help="the token's name (create_user --token makes 'cli')")
        parser.add_argument("--all", action="store_true", dest="everything")

    def handle(self, username, name, everything, **options):
        user = get_user_model().objects.filter(username=username).first()
        if user is None:
            raise CommandError(f"unknown user {username!r}")
        if name is None and not everything:
            for token in active_tokens(user):
                expires = token.expires_at.isoformat() if token.expires_at else "never"
                self.stdout.write(f"{token.name}\t{token.prefix}…\texpires {expires}")
            raise CommandError("say which: --name NAME or --all")
        try:
            count = token_revoke(user=user, name=name, everything=everything)
        except TokenError as error:
            raise CommandError(str(error)) from None
        if name is not None and not count:
            raise CommandError(f"{username} has no active token named {name!r}")
        self.stdout.write(f"revoked {count} token(s) of {username}")
