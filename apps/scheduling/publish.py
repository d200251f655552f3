"""Messages to node agents. They are hints: the database is the truth, and each agent also
polls it on every heartbeat, so a message lost here is repaired within one interval."""

import logging

from gpuplatform.celery import app

from .queues import START_ATTEMPT_TASK, STOP_ATTEMPT_TASK, node_queue

log = logging.getLogger(__name__)


def _send(task: str, queue: str, **kwargs) -> None:
    try:
        app.send_task(task, kwargs=kwargs, queue=queue, retry=False, expires=300)
    except Exception:  # broker down: the agent's poll picks the work up
        log.warning("could not publish %s to %s; the agent poll will repair it", task, queue, exc_info=True)


def publish_start(attempt) -> None:
    for member in attempt.members.select_related("node"):
        _send(START_ATTEMPT_TASK, node_queue(member.node.name), attempt_id=attempt.pk, rank=member.rank,
              token=str(attempt.token))  # fmt: skip


def publish_stop(attempt, member) -> None:
    _send(STOP_ATTEMPT_TASK, node_queue(member.node.name), attempt_id=attempt.pk, rank=member.rank,
          token=str(attempt.token), why=attempt.stop_requested)  # fmt: skip
