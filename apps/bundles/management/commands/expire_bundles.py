"""`python manage.py expire_bundles [--days N]`: delete (row and file) every code bundle that no
queued or running job uses and that was last used more than GPUPLATFORM_BUNDLE_RETENTION_DAYS
(or N) days ago. The beat runs the same every GPUPLATFORM_BUNDLE_EXPIRE_TICK seconds."""

from django.core.management.base import BaseCommand

from apps.bundles.services import expire


class Command(BaseCommand):
    help = "Delete unreferenced code bundles past their retention."

    def add_arguments(self, parser):
        parser.add_argument("--days", type=int, default=None, help="default: the setting's")

    def handle(self, *args, days, **options):
        deleted = expire(days=days)
        for name in deleted:
            self.stdout.write(f"deleted {name}")
        self.stdout.write(f"{len(deleted)} bundles expired")
