"""Tasks consumed by node agents on their own queue (`node.<name>`). Thin hand-offs: the
long-running job lives in the agent's runner, so a task never outlives the broker's visibility
timeout and a redelivered one is a no-op (the runner launches a member once)."""

import logging

from celery import shared_task

from apps.scheduling.queues import START_ATTEMPT_TASK, STOP_ATTEMPT_TASK

log = logging.getLogger(__name__)


def _agent():
    from workers import current

    if current.AGENT is None:
        log.warning("node task received outside a node agent; ignored")
    return current.AGENT


@shared_task(name=START_ATTEMPT_TASK, ignore_result=True)
def start_attempt(attempt_id: int, rank: int, token: str) -> None:
    from apps.jobs.selectors import assignment

    agent = _agent()
    if agent is None:
        return
    work = assignment(attempt_id, rank, token)
    if work is None or not work.active:
        log.info("attempt %s rank %s is no longer active; not starting it", attempt_id, rank)
        return
    agent.runner.launch(work)


@shared_task(name=STOP_ATTEMPT_TASK, ignore_result=True)
def stop_attempt(attempt_id: int, rank: int, token: str, why: str = "stop") -> None:
    agent = _agent()
    if agent is not None:
        agent.runner.stop(attempt_id, rank, why)
