"""`python manage.py deliver_webhooks [--once] [--interval S]`: the webhook outbox pump."""

import time

from django.core.management.base import BaseCommand

from apps.webhooks.services import pump


class Command(BaseCommand):
    help = "Turn job state changes into webhook deliveries and send the due ones (retries with backoff)."

    def add_arguments(self, parser):
        parser.add_argument("--once", action="store_true")
        parser.add_argument("--interval", type=float, default=1.0)

    def handle(self, *args, once=False, interval=1.0, **options):
        while True:
            pump()
            if once:
                return
            time.sleep(interval)
