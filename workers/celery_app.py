"""The node agent's own Celery app: no Django, no platform settings. Its broker URL (with the
node's own broker credential) comes from the agent API's register answer; it consumes only its
node's queue. The dispatcher publishes to it by task name (apps/scheduling/queues.py)."""

from __future__ import annotations

import warnings

from celery import Celery
from celery.exceptions import SecurityWarning

from apps.platform import broker_keys

app = Celery("gpuplatform-agent", set_as_current=False)


def configure(*, broker_url: str, node: str, visibility_timeout: int) -> Celery:
    # As the platform's (gpuplatform/settings.py, docs/reliability.md): hand-offs are short,
    # acknowledged late, and a redelivery is a no-op checked against the agent API. On top, what
    # the node's broker ACL user allows (apps/platform/broker_keys.py): its own queue and
    # unacked keys, no events, no remote control. Unlike the platform's, the agent keeps no copy
    # of a taken message in Redis (below).
    settings = broker_keys.agent_celery_settings(node, visibility_timeout=visibility_timeout)
    settings["broker_transport_options"] = {
        **settings["broker_transport_options"],
        **NO_ACK_EMULATION,
    }
    app.conf.update(
        broker_url=broker_url,
        task_acks_late=True,
        task_reject_on_worker_lost=True,
        worker_prefetch_multiplier=4,
        task_ignore_result=True,
        result_backend=None,
        # No results are kept (the disabled backend), so one backend object serves every thread:
        # else each of the pool's threads builds its own at its first task, and each build scans
        # every installed package's entry points for backend names (5-11 ms of CPU a thread).
        result_backend_thread_safe=True,
        broker_connection_retry_on_startup=True,
        timezone="UTC",
        accept_content=["json"],  # never pickle: what Celery's root check is about (below)
        **settings,
    )
    quiet_root_warning()
    import workers.tasks  # noqa: F401 (registers the node tasks on this app)

    return app


NO_ACK_EMULATION = {"ack_emulation": False}
"""kombu's Redis transport emulates AMQP acks: each message taken is first written to the
`unacked` hash and index (one MULTI/EXEC), then deleted from them at the ack (another), so that a
consumer that dies holding it gets it back after the visibility timeout. For the agent that copy
never repairs anything: the message is for the agent instance that died (a new one registers as a
new instance, and the platform ends the old one's attempts `lost`), and it would come back an hour
later. What repairs a start the agent took and did not launch is the database: the heartbeat's
sync while the agent lives, the node's loss (or its next agent's register) when it dies
(docs/reliability.md, "A start message taken by an agent that dies"). Off, a taken message lives
only in the agent's memory until its ack (kombu's in-memory QoS: the prefetch limit still holds,
and a warm shutdown still pushes back what it did not run). Those two pipelines were about a third
of the agent's Python a drained job (docs/bench/71-slurm-peer-notes.md, h36agent)."""


def quiet_root_warning() -> None:
    """Celery warns at every worker start as root ("You're running the worker with superuser
    privileges"). The agent runs as root on purpose where it fences jobs: each job under a uid of
    its own, in cgroups it makes (docs/architecture.md, "Isolation"); its tasks are JSON hand-offs
    checked against the agent API, never pickle (which Celery refuses outright as root). The
    warning said nothing an operator could act on, once per agent: only that one is silenced."""
    warnings.filterwarnings(
        "ignore", message="You're running the worker with superuser privileges",
        category=SecurityWarning,
    )  # fmt: skip


WORKER_OPTIONS = broker_keys.AGENT_WORKER_OPTIONS
