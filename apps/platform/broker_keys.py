"""The Redis keys a node agent's Celery consumer touches, and the Celery settings that keep it to
them. Shared by the server, which builds each node's Redis ACL user from these names
(apps/nodes/broker.py), and the agent, which configures its Celery app with them
(workers/celery_app.py). Pure Python: the agent imports no Django.

Why each setting (found by running a real worker under the ACL and reading `ACL LOG`; see
docs/reliability.md, "What an agent's broker credential can do"):
- kombu's Redis transport keeps unacknowledged messages in one hash for every consumer
  (`unacked`); a node would have to be allowed to read and delete everyone's in-flight messages,
  and its visibility restore would try to push other nodes' messages back to their queues. Its
  own `unacked.node.<name>` keys (kombu's `unacked_*_key` transport options) avoid both.
- No remote control, no events, no heartbeat/gossip/mingle: those are pub/sub channels and
  pidbox queues shared by every worker, which an agent does not need (its state reaches the
  platform through the agent API) and which would let it read other workers' task events.
- The queue is not declared by the agent (`no_declare`): the platform binds it when it hands out
  the credential, so the agent needs no write to the binding sets. The platform's messages to
  it go through the anonymous exchange (routing key = the list's name), which needs no binding:
  the dispatcher does not declare the queue on each publish either (apps/scheduling/publish.py).
"""

from __future__ import annotations

from apps.platform.names import node_queue

SEP = "\x06\x16"  # kombu's Redis transport: a priority queue is <queue><SEP><step>
PRIORITY_STEPS = (0, 3, 6, 9)  # kombu's default priority_steps (step 0 is the queue itself)
BINDING_PREFIX = "_kombu.binding."


def queue_keys(node_name: str) -> list[str]:
    """The lists the node's consumer pops: its queue and kombu's priority variants of it."""
    queue = node_queue(node_name)
    return [queue] + [f"{queue}{SEP}{step}" for step in PRIORITY_STEPS if step]


def binding_key(node_name: str) -> str:
    """The set kombu reads to route a message for the node's exchange (its restore reads it)."""
    return BINDING_PREFIX + node_queue(node_name)


def binding_member(node_name: str) -> str:
    """The node queue's binding (routing key = queue name, no pattern), as kombu writes it."""
    queue = node_queue(node_name)
    return SEP.join([queue, "", queue])


def unacked_options(node_name: str) -> dict[str, str]:
    """kombu's ack-emulation keys, the node's own."""
    queue = node_queue(node_name)
    return {
        "unacked_key": f"unacked.{queue}",
        "unacked_index_key": f"unacked_index.{queue}",
        "unacked_mutex_key": f"unacked_mutex.{queue}",
    }


def node_keys(node_name: str) -> list[str]:
    """Every key the node's ACL user may touch."""
    return [*queue_keys(node_name), binding_key(node_name), *unacked_options(node_name).values()]


def agent_celery_settings(node_name: str, *, visibility_timeout: int) -> dict:
    """What the agent's Celery app must set (on top of its own) to work under the node's ACL."""
    from kombu import Exchange, Queue

    queue = node_queue(node_name)
    return {
        "task_queues": [Queue(queue, Exchange(queue), routing_key=queue, no_declare=True)],
        "task_default_queue": queue,
        "broker_transport_options": {
            "visibility_timeout": visibility_timeout,
            **unacked_options(node_name),
        },
        "worker_enable_remote_control": False,
        "worker_send_task_events": False,
        "task_send_sent_event": False,
    }


# Keyword arguments for the agent's `app.Worker(...)` (or `--without-*` flags of `celery worker`).
AGENT_WORKER_OPTIONS = {"without_mingle": True, "without_gossip": True, "without_heartbeat": True}
