"""The names processes agree on: Celery queues and task names, why an attempt is stopped, and
the end reasons recorded for it. StrEnums equal to their strings, so a name stored in a row or
sent in a message compares equal to the member. No Django here: the node agent imports it."""

from enum import StrEnum


class Queue(StrEnum):
    CONTROL = "control"  # the dispatcher: dispatch and reconcile passes
    WEBHOOKS = (
        "webhooks"  # webhook sends, on their own worker: a slow receiver never holds the dispatcher
    )


def node_queue(node_name: str) -> str:
    """Each node agent consumes its own queue, so a placement reaches exactly its node."""
    return f"node.{node_name}"


class Task(StrEnum):
    DISPATCH = "scheduling.dispatch"
    RECONCILE = "scheduling.reconcile"
    AUTOSCALE = "scheduling.autoscale"
    START_ATTEMPT = "workers.start_attempt"
    # What one dispatcher pass placed on one node, in one message: [{attempt_id, rank, token}, ...]
    START_ATTEMPTS = "workers.start_attempts"
    STOP_ATTEMPT = "workers.stop_attempt"
    # A session (docs/interactive.md) waits for this node's agent: {"session": id}, a hint only.
    OPEN_SESSION = "workers.open_session"
    WEBHOOKS_PUMP = "webhooks.pump"
    WEBHOOKS_DELIVER = "webhooks.deliver"
    EXPIRE_BUNDLES = "bundles.expire"
    PURGE_TELEMETRY = "telemetry.purge"


# JobEvent.kind of an idle-GPU warning (apps/telemetry/idle.py): streamed, and a webhook of
# this type.
GPU_IDLE_KIND = "gpu.idle"


class StopReason(StrEnum):
    """Why an attempt's processes are told to stop (`JobAttempt.stop_requested`, the stop
    message's `why`, the runner's `stop_reason`)."""

    CANCEL = "cancel"  # the job was cancelled: the attempt ends cancelled
    REQUEUE = "requeue"  # support staff put the job back in the queue
    PREEMPT = "preempt"  # checkpoint and stop; the job is queued again
    GANG_MEMBER_FAILED = "gang member failed"  # another member of the gang failed
    LOST = "lost"  # the attempt was lost (node gone, lease expired): stop what is left of it
    TIMEOUT = "timeout"  # the runner: the job passed its max runtime
    AGENT_STOPPING = "agent stopping"  # the agent shuts down: retried elsewhere
    AGENT_REPLACED = "agent replaced"  # another agent instance took the node: this one exits
    FENCED = "cut off from the platform"  # the agent missed its heartbeats: its jobs die at once
    UNASSIGNED = "not assigned here any more"  # the database no longer has it on this node
    # An interactive job's shell exited on one rank (docs/interactive.md): the other ranks'
    # holding processes exit 0 with it (workers/sessions.py end_hold), no signal sent.
    SHELL_EXITED = "interactive shell exited"


class EndReason(StrEnum):
    """Reasons recorded when an attempt or one of its members ends."""

    TIMEOUT = "timeout"  # reported by the runner: the job passed its max runtime
    CANCELLED = "cancelled"
    PREEMPTED = "preempted"
    AGENT_STOPPED = "agent stopped"
    AGENT_FENCED = f"agent {StopReason.FENCED}"
    AGENT_UNASSIGNED = f"agent: {StopReason.UNASSIGNED}"
    NOT_SETTLED = "members ended but the attempt was not settled"


# What the agent reports as an infrastructure loss (retried), by the stop that caused it (keyed
# by string: the runner looks up its `stop_reason`, which may also be the platform's word).
LOST_BY_AGENT_STOP: dict[str, EndReason] = {
    StopReason.AGENT_STOPPING: EndReason.AGENT_STOPPED,
    StopReason.FENCED: EndReason.AGENT_FENCED,
    StopReason.UNASSIGNED: EndReason.AGENT_UNASSIGNED,
}
