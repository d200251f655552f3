"""Thin Celery tasks for the webhook outbox, on the `webhooks` queue and its own worker
(Procfile `webhooks`): the beat's `webhooks.pump` records deliveries and hands each webhook with
due ones to a `webhooks.deliver`, so one slow receiver holds one task (and at most its receiver's
slots), never the pump or anyone else's deliveries. `manage.py deliver_webhooks` is the
no-Celery alternative."""

from celery import shared_task
from django.utils import timezone

from apps.platform.names import Queue, Task
from apps.webhooks.services import deliveries_enqueue, webhook_deliver, webhooks_due

PUMP_TASK = Task.WEBHOOKS_PUMP
DELIVER_TASK = Task.WEBHOOKS_DELIVER
DELIVER_EXPIRES_SECONDS = 30  # a deliver not started by then is superseded by later pumps


@shared_task(name=PUMP_TASK, ignore_result=True)
def pump_task() -> None:
    deliveries_enqueue()
    for webhook_id in webhooks_due(now=timezone.now()):
        deliver_task.apply_async(
            (webhook_id,), queue=Queue.WEBHOOKS, expires=DELIVER_EXPIRES_SECONDS
        )


@shared_task(name=DELIVER_TASK, ignore_result=True)
def deliver_task(webhook_id: int) -> None:
    webhook_deliver(webhook_id=webhook_id)
