"""The names processes agree on (apps/platform/names.py) keep their wire strings: rows, Celery
messages and agents already running compare them with plain strings."""

from apps.platform.names import LOST_BY_AGENT_STOP, EndReason, Queue, StopReason, Task, node_queue
from apps.scheduling import queues


def test_queues_and_task_names_are_the_strings_celery_already_routes():
    assert Queue.CONTROL == "control" and node_queue("h1") == "node.h1"
    assert Queue.WEBHOOKS == "webhooks"
    assert {task.value for task in Task} == {
        "scheduling.dispatch", "scheduling.reconcile", "scheduling.autoscale", "workers.start_attempt",
        "workers.start_attempts", "workers.stop_attempt", "webhooks.pump", "webhooks.deliver", "bundles.expire",
        "telemetry.purge",
        "workers.open_session",
    }  # fmt: skip


def test_the_old_module_still_names_them():
    assert queues.CONTROL == "control" and queues.node_queue("h1") == "node.h1"
    assert (queues.DISPATCH_TASK, queues.START_ATTEMPT_TASK) == (
        "scheduling.dispatch",
        "workers.start_attempt",
    )


def test_stop_and_end_reasons_are_todays_strings():
    assert (
        StopReason.CANCEL == "cancel"
        and StopReason.PREEMPT == "preempt"
        and StopReason.TIMEOUT == "timeout"
    )
    assert StopReason.AGENT_STOPPING == "agent stopping"
    assert StopReason.FENCED == "cut off from the platform"
    assert StopReason.UNASSIGNED == "not assigned here any more"
    assert LOST_BY_AGENT_STOP == {
        "agent stopping": "agent stopped",
        "cut off from the platform": "agent cut off from the platform",
        "not assigned here any more": "agent: not assigned here any more",
    }
    assert EndReason.CANCELLED == "cancelled" and f"{EndReason.PREEMPTED}" == "preempted"
