"""Messages to node agents. They are hints: the database is the truth, and each agent also
polls it on every heartbeat, so a message lost here is repaired within one interval."""

import logging

from celery import current_app

from apps.platform.names import Task, node_queue

log = logging.getLogger(__name__)


def _send(task: str, queue: str, **kwargs) -> None:
    try:
        # The project's Celery app (gpuplatform/celery.py, loaded with Django's settings): named
        # through Celery, not imported, since gpuplatform sits above the apps.
        current_app.send_task(task, kwargs=kwargs, queue=queue, retry=False, expires=300)
    except Exception:  # broker down: the agent's poll picks the work up
        log.warning(
            "could not publish %s to %s; the agent poll will repair it", task, queue, exc_info=True
        )


def publish_start(attempt) -> None:
    for member in attempt.members.select_related("node"):
        _send(Task.START_ATTEMPT, node_queue(member.node.name), attempt_id=attempt.pk, rank=member.rank,
              token=str(attempt.token))  # fmt: skip


def publish_stop(attempt, member) -> None:
    _send(Task.STOP_ATTEMPT, node_queue(member.node.name), attempt_id=attempt.pk, rank=member.rank,
          token=str(attempt.token), why=attempt.stop_requested)  # fmt: skip
