"""Thin Celery task for the webhook outbox, for a beat entry (every second or two) as an
alternative to running `manage.py deliver_webhooks`."""

from celery import shared_task

from apps.platform.names import Task
from apps.webhooks.services import pump

PUMP_TASK = Task.WEBHOOKS_PUMP


@shared_task(name=PUMP_TASK, ignore_result=True)
def pump_task() -> None:
    pump()
