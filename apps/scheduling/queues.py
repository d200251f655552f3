"""Every Celery queue and task name, kept importable here; they live on the ground floor
(apps/platform/names.py), where the node agent can import them without Django."""

from apps.platform.names import Queue, Task, node_queue

CONTROL = Queue.CONTROL  # the dispatcher: dispatch and reconcile passes

DISPATCH_TASK = Task.DISPATCH
RECONCILE_TASK = Task.RECONCILE
AUTOSCALE_TASK = Task.AUTOSCALE
START_ATTEMPT_TASK = Task.START_ATTEMPT
START_ATTEMPTS_TASK = Task.START_ATTEMPTS
STOP_ATTEMPT_TASK = Task.STOP_ATTEMPT

__all__ = [
    "AUTOSCALE_TASK", "CONTROL", "DISPATCH_TASK", "RECONCILE_TASK", "START_ATTEMPT_TASK", "START_ATTEMPTS_TASK", "STOP_ATTEMPT_TASK",
    "Queue", "Task", "node_queue",
]  # fmt: skip
