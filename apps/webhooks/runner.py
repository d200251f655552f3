"""The one-process pump (`manage.py deliver_webhooks`): the same split as the Celery worker's,
in a thread pool. Each tick records new deliveries and gives every webhook with due ones that
is not already being sent a thread; a webhook whose receiver is slow keeps its own thread busy
while the others go on, and its receiver's slots (apps/webhooks/slots.py) bound how many threads
one receiver can hold."""

from __future__ import annotations

from concurrent.futures import Future, ThreadPoolExecutor
from datetime import datetime

from django.db import close_old_connections, connection
from django.utils import timezone

from apps.webhooks.services import deliveries_enqueue, webhook_deliver, webhooks_due


class LocalPump:
    def __init__(self, *, workers: int = 4):
        self.pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="webhooks")
        self.in_flight: dict[int, Future] = {}

    def tick(self, *, now: datetime | None = None) -> list[Future]:
        """Start sends for the webhooks due now; returns the futures started."""
        now = now or timezone.now()
        deliveries_enqueue(now=now)
        self.in_flight = {w: f for w, f in self.in_flight.items() if not f.done()}
        started = []
        for webhook_id in webhooks_due(now=now):
            if webhook_id not in self.in_flight:
                started.append(
                    self.in_flight.setdefault(
                        webhook_id, self.pool.submit(_deliver, webhook_id, now)
                    )
                )
        return started

    def shutdown(self) -> None:
        self.pool.shutdown(wait=True)


def _deliver(webhook_id: int, now: datetime) -> int:
    close_old_connections()
    try:
        return webhook_deliver(webhook_id=webhook_id, now=now)
    finally:
        connection.close()  # this thread's own connection; the pool's threads are long-lived
