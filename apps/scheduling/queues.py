"""Every Celery queue and task name in one place."""

CONTROL = "control"  # the dispatcher: dispatch and reconcile passes


def node_queue(node_name: str) -> str:
    """Each node agent consumes its own queue, so a placement reaches exactly its node."""
    return f"node.{node_name}"


DISPATCH_TASK = "scheduling.dispatch"
RECONCILE_TASK = "scheduling.reconcile"
AUTOSCALE_TASK = "scheduling.autoscale"
START_ATTEMPT_TASK = "workers.start_attempt"
STOP_ATTEMPT_TASK = "workers.stop_attempt"
