"""The node agent's own Celery app: no Django, no platform settings. Its broker URL (with the
node's own broker credential) comes from the agent API's register answer; it consumes only its
node's queue. The dispatcher publishes to it by task name (apps/scheduling/queues.py)."""

from __future__ import annotations

from celery import Celery

app = Celery("gpuplatform-agent", set_as_current=False)


def configure(*, broker_url: str, queue: str, visibility_timeout: int, node: str | None = None) -> Celery:
    # As the platform's (gpuplatform/settings.py, docs/reliability.md): hand-offs are short,
    # acknowledged late, and a redelivery is a no-op checked against the agent API.
    app.conf.update(
        broker_url=broker_url, task_default_queue=queue, task_acks_late=True, task_reject_on_worker_lost=True,
        worker_prefetch_multiplier=4, task_ignore_result=True, result_backend=None,
        broker_connection_retry_on_startup=True, worker_send_task_events=True, timezone="UTC",
        broker_transport_options={"visibility_timeout": visibility_timeout},
    )  # fmt: skip
    if node is not None:
        # Under the node's own broker user (apps/nodes/broker.py): its own unacked keys, no
        # events, no remote control, no declare (apps/platform/broker_keys.py says why).
        from apps.platform.broker_keys import agent_celery_settings

        app.conf.update(agent_celery_settings(node, visibility_timeout=visibility_timeout))
    import workers.tasks  # noqa: F401 (registers the node tasks on this app)

    return app
