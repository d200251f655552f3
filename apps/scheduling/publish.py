"""Messages to node agents. They are hints: the database is the truth, and each agent also
polls it on every heartbeat, so a message lost here is repaired within one interval.

Inside `batched()` (a dispatcher pass), the starts of the attempts placed are collected and sent
when it ends, one message per node naming all that node's members (Task.START_ATTEMPTS), with
their whole assignments signed for the agent that runs the node now (apps/platform/
agent_protocol.py, "signed start messages"): the agent starts them without a request. Outside
it, each member gets its own start message, which the agent confirms through the agent API."""

import contextlib
import logging
import threading
import time
from collections import defaultdict

from celery import current_app

from apps.nodes.credentials import message_key
from apps.platform import agent_protocol as wire
from apps.platform.names import Task, node_queue

log = logging.getLogger(__name__)
_collecting = threading.local()


def _send(task: str, queue: str, **kwargs) -> None:
    try:
        # The project's Celery app (gpuplatform/celery.py, loaded with Django's settings): named
        # through Celery, not imported, since gpuplatform sits above the apps.
        # `declare=[]`: Celery sends a node queue's messages through the anonymous exchange (the
        # routing key is the list's name: kombu pushes to it without a binding), and the node's
        # binding is made with its broker credential (apps/nodes/broker.py); a declare per new
        # queue and pooled connection cost an LLEN pipeline and a SADD (a tenth of a pass that
        # starts jobs on 1,000 nodes for the first time, docs/bench/50-queue-scale.md).
        current_app.send_task(task, kwargs=kwargs, queue=queue, retry=False,
                              expires=wire.START_MESSAGE_SECONDS, argsrepr="()",
                              kwargsrepr=shown(kwargs), declare=[])  # fmt: skip
    except Exception:  # broker down: the agent's poll picks the work up
        log.warning(
            "could not publish %s to %s; the agent poll will repair it", task, queue, exc_info=True
        )


def shown(kwargs: dict) -> str:
    """A message's arguments as Celery shows them (its `kwargsrepr`: the message's headers, the
    task-sent event that Flower and every event subscriber read, the agent's log): the names, never
    an attempt's token, in the message itself or inside the signed assignments. Also spares the
    dispatcher Celery's own repr of up to 1 KiB of each message (a fifth of a pass's publishing,
    docs/bench/50-queue-scale.md)."""
    out: dict = {}
    for name, value in kwargs.items():
        if name == "token":
            out[name] = "<hidden>"
        elif name == "members":
            out[name] = [{k: v for k, v in member.items() if k != "token"} for member in value]
        elif name in ("signed", "signature"):
            out[name] = f"<{len(value)} characters>"
        else:
            out[name] = value
    return repr(out)


@contextlib.contextmanager
def batched():
    """Collect the start messages published meanwhile (on commit of the placements) and send
    them, one per node, when the block ends (also when it raises: what committed is placed)."""
    outer = getattr(_collecting, "starts", None)
    if outer is not None:  # already collecting: the outermost block sends
        yield
        return
    # Per node: each member's start (its names) with the agent instance and assignment to sign
    # it for (None where the placement carried none).
    starts: dict[str, list[tuple[dict, str, wire.Assignment | None]]] = defaultdict(list)
    _collecting.starts = starts
    try:
        yield
    finally:
        _collecting.starts = None
        for node, entries in starts.items():
            members = [start for start, _, _ in entries]
            _send(Task.START_ATTEMPTS, node_queue(node), members=members, **_signed(node, entries))


def _signed(node: str, entries: list[tuple[dict, str, wire.Assignment | None]]) -> dict:
    """The node's start message's `signed` assignments and `signature`, for the agent that ran
    the node when they were placed; {} (the names only, confirmed by the agent through the agent
    API) where an assignment is missing or no agent has registered on the node."""
    instances = {instance for _, instance, _ in entries}
    works = [work for _, _, work in entries if work is not None]
    if len(works) != len(entries) or len(instances) != 1 or not next(iter(instances)):
        return {}
    (instance,) = instances
    return wire.signed_start_message(message_key(node_name=node, agent_instance=instance), node=node,
                                     agent_instance=instance, members=works,
                                     expires=time.time() + wire.START_MESSAGE_SECONDS)  # fmt: skip


def publish_start(
    attempt, nodes: tuple[str, ...], assignments: tuple = (), agents: tuple = ()
) -> None:
    """Start messages for a new attempt whose members run on `nodes` (by rank), with their
    `assignments` and the `agents` running those nodes to sign them for: no rows read."""
    starts = getattr(_collecting, "starts", None)
    signable = len(assignments) == len(nodes) and len(agents) == len(nodes)
    for rank, node in enumerate(nodes):
        start = {"attempt_id": attempt.pk, "rank": rank, "token": str(attempt.token)}
        if starts is not None:
            starts[node].append((start, agents[rank] if signable else "",
                                 assignments[rank] if signable else None))  # fmt: skip
        else:
            _send(Task.START_ATTEMPT, node_queue(node), **start)


def publish_stop(attempt, member) -> None:
    _send(Task.STOP_ATTEMPT, node_queue(member.node.name), attempt_id=attempt.pk, rank=member.rank,
          token=str(attempt.token), why=attempt.stop_requested)  # fmt: skip
