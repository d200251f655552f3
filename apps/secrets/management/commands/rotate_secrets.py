from django.conf import settings
from django.core.management.base import BaseCommand, CommandError

from apps.secrets.services import secrets_rotate


class Command(BaseCommand):
    help = (
        "Re-encrypt every tenant secret under the first of GPUPLATFORM_SECRET_KEYS (the others "
        "still decrypt until then). Prints counts only, never a name or value. docs/secrets.md."
    )

    def handle(self, **options):
        keys = len(settings.SECRET_ENCRYPTION_KEYS) or 1
        rotated, unreadable = secrets_rotate()
        self.stdout.write(f"rotated {rotated} secret(s) under the first of {keys} key(s)")
        if unreadable:
            raise CommandError(
                f"{unreadable} secret(s) could not be decrypted with any configured key: left "
                "as they were (put back the key they were written under, then run this again)"
            )
