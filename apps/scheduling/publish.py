"""Messages to node agents. They are hints: the database is the truth, and each agent also
polls it on every heartbeat, so a message lost here is repaired within one interval.

Inside `batched()` (a dispatcher pass), the starts of the attempts placed are collected and sent
when it ends, one message per node naming all that node's members (Task.START_ATTEMPTS): an
agent checks them with one request. Outside it, each member gets its own start message."""

import contextlib
import logging
import threading
from collections import defaultdict

from celery import current_app

from apps.platform.names import Task, node_queue

log = logging.getLogger(__name__)
_collecting = threading.local()


def _send(task: str, queue: str, **kwargs) -> None:
    try:
        # The project's Celery app (gpuplatform/celery.py, loaded with Django's settings): named
        # through Celery, not imported, since gpuplatform sits above the apps.
        current_app.send_task(task, kwargs=kwargs, queue=queue, retry=False, expires=300)
    except Exception:  # broker down: the agent's poll picks the work up
        log.warning(
            "could not publish %s to %s; the agent poll will repair it", task, queue, exc_info=True
        )


@contextlib.contextmanager
def batched():
    """Collect the start messages published meanwhile (on commit of the placements) and send
    them, one per node, when the block ends (also when it raises: what committed is placed)."""
    outer = getattr(_collecting, "starts", None)
    if outer is not None:  # already collecting: the outermost block sends
        yield
        return
    starts: dict[str, list[dict]] = defaultdict(list)
    _collecting.starts = starts
    try:
        yield
    finally:
        _collecting.starts = None
        for node, members in starts.items():
            if len(members) == 1:
                _send(Task.START_ATTEMPT, node_queue(node), **members[0])
            else:
                _send(Task.START_ATTEMPTS, node_queue(node), members=members)


def publish_start(attempt, nodes: tuple[str, ...]) -> None:
    """Start messages for a new attempt whose members run on `nodes` (by rank): no rows read."""
    starts = getattr(_collecting, "starts", None)
    for rank, node in enumerate(nodes):
        start = {"attempt_id": attempt.pk, "rank": rank, "token": str(attempt.token)}
        if starts is not None:
            starts[node].append(start)
        else:
            _send(Task.START_ATTEMPT, node_queue(node), **start)


def publish_stop(attempt, member) -> None:
    _send(Task.STOP_ATTEMPT, node_queue(member.node.name), attempt_id=attempt.pk, rank=member.rank,
          token=str(attempt.token), why=attempt.stop_requested)  # fmt: skip
