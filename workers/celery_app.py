"""The node agent's own Celery app: no Django, no platform settings. Its broker URL (with the
node's own broker credential) comes from the agent API's register answer; it consumes only its
node's queue. The dispatcher publishes to it by task name (apps/scheduling/queues.py)."""

from __future__ import annotations

from celery import Celery

from apps.platform import broker_keys

app = Celery("gpuplatform-agent", set_as_current=False)


def configure(*, broker_url: str, node: str, visibility_timeout: int) -> Celery:
    # As the platform's (gpuplatform/settings.py, docs/reliability.md): hand-offs are short,
    # acknowledged late, and a redelivery is a no-op checked against the agent API. On top, what
    # the node's broker ACL user allows (apps/platform/broker_keys.py): its own queue and
    # unacked keys, no events, no remote control.
    app.conf.update(
        broker_url=broker_url,
        task_acks_late=True,
        task_reject_on_worker_lost=True,
        worker_prefetch_multiplier=4,
        task_ignore_result=True,
        result_backend=None,
        broker_connection_retry_on_startup=True,
        timezone="UTC",
        **broker_keys.agent_celery_settings(node, visibility_timeout=visibility_timeout),
    )
    import workers.tasks  # noqa: F401 (registers the node tasks on this app)

    return app


WORKER_OPTIONS = broker_keys.AGENT_WORKER_OPTIONS
