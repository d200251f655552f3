"""`python manage.py deliver_webhooks [--once] [--interval S] [--workers N]`: the webhook outbox
pump without Celery. Sends run on N threads, one webhook per thread at a time (runner.py)."""

import time

from django.core.management.base import BaseCommand

from apps.webhooks.runner import LocalPump
from apps.webhooks.services import pump


class Command(BaseCommand):
    help = "Turn job state changes into webhook deliveries and send the due ones (retries with backoff)."

    def add_arguments(self, parser):
        parser.add_argument(
            "--once", action="store_true", help="One pass in this thread, then exit."
        )
        parser.add_argument("--interval", type=float, default=1.0)
        parser.add_argument("--workers", type=int, default=4, help="Send threads (default 4).")

    def handle(self, *args, once=False, interval=1.0, workers=4, **options):
        if once:
            pump()
            return
        local = LocalPump(workers=max(1, workers))
        try:
            while True:
                local.tick()
                time.sleep(interval)
        finally:
            local.shutdown()
