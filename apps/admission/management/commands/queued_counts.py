"""Check each tenant's kept count of queued jobs against a count of the queue."""

from django.core.management.base import BaseCommand, CommandError
from django.db import transaction

from apps.admission import queued


class Command(BaseCommand):
    help = "Compare the queued-job counts kept by triggers with a count of the queue; --fix counts again."

    def add_arguments(self, parser):
        parser.add_argument(
            "--fix", action="store_true", help="install missing triggers and count the queue again"
        )

    def handle(self, *args, fix: bool = False, **options):
        missing = {
            f"{queued.PREFIX}_{op}" for op in ("insert", "update", "delete")
        } - queued.installed()
        wrong = queued.differences()
        for tenant, (kept, counted) in sorted(wrong.items()):
            self.stdout.write(f"tenant {tenant}: kept {kept}, counted {counted}")
        if missing:
            self.stdout.write(f"triggers missing: {', '.join(sorted(missing))}")
        if not wrong and not missing:
            self.stdout.write("queued-job counts agree with the queue")
            return
        if not fix:
            raise CommandError("queued-job counts disagree with the queue (run with --fix)")
        created = queued.install()
        if not created:
            with transaction.atomic():
                queued.recount()
        self.stdout.write("counted again")
