"""`python manage.py create_node_credential NAME [--expires-days N]`: issue a node agent's credential
(printed once, as the last line; stored hashed). `--revoke`: end all of NAME's credentials and its
broker user now."""

import redis
from django.core.management.base import BaseCommand, CommandError

from apps.nodes.credentials import issue_credential, revoke_node


class Command(BaseCommand):
    help = __doc__

    def add_arguments(self, parser):
        parser.add_argument("name", help="node name, as the agent's --node gives it")
        parser.add_argument(
            "--expires-days",
            type=float,
            default=None,
            help="valid this many days (default: no expiry)",
        )
        parser.add_argument(
            "--revoke", action="store_true", help="revoke every credential of NAME instead"
        )

    def handle(self, *args, name: str, expires_days, revoke: bool, **options):
        if not name or len(name) > 64:
            raise CommandError("NAME must be 1 to 64 characters")
        if revoke:
            self._revoke(name)
            return
        if expires_days is not None and expires_days <= 0:
            raise CommandError("--expires-days must be above 0")
        row, text = issue_credential(node_name=name, expires_days=expires_days)
        expiry = f"expires {row.expires_at:%Y-%m-%d %H:%M} UTC" if row.expires_at else "no expiry"
        self.stdout.write(f"node credential for {name} ({expiry}); shown once, give it to the agent as "
                          "GPUPLATFORM_NODE_CREDENTIAL or --credential-file:")  # fmt: skip
        self.stdout.write(text)

    def _revoke(self, name: str) -> None:
        try:
            count = revoke_node(node_name=name)
        except redis.RedisError as error:
            raise CommandError(
                f"the credentials of node {name} are revoked (its agent gets 401), but its broker "
                f"user could not be deleted ({error}): run --revoke again once Redis answers"
            ) from None
        self.stdout.write(
            f"revoked {count} credential(s) of node {name} and its broker user; its agent gets 401 "
            "from now on and can no longer consume"
        )
