"""A small event bus: a service says what happened, the apps above it decide what follows.

This is how effects go up while imports go down: `apps.jobs` cannot import the scheduler or
the result cache (they import it), so a job's service emits `JobEnded` or `DispatchWanted`,
and the apps above subscribe in their `AppConfig.ready()`.

Two kinds of handler:

- after commit (`subscribe`, the default): effects outside the database, such as a Celery
  message or a dispatch request. They run once the current transaction commits
  (`transaction.on_commit`; at once outside a transaction, as on_commit does), never for a
  transaction rolled back. A handler that raises is logged and the others still run: each of
  these effects is a hint that something repairs when it is lost (the reconcile tick, the
  dispatcher's beat tick, the agent's poll of its assignments), and one failing must not
  swallow the others.
- in the transaction (`subscribe(..., in_transaction=True)`): changes to other rows that must
  commit or roll back with the change that caused them (a cached job's followers end with
  their origin; a lost node's attempts are lost with it). They run inside `emit`, in the
  emitter's transaction; their exceptions propagate, and what they return comes back from
  `emit`.

Events carry ids and plain values where they can. Where a handler needs the row the emitter
holds (the result cache needs the ended job as it is now), the event carries that object:
handlers read it and never change it.
"""

from __future__ import annotations

import functools
import logging
import threading
from collections import defaultdict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from django.db import transaction

log = logging.getLogger(__name__)


# --- the events -----------------------------------------------------------------------------


@dataclass(frozen=True)
class JobEnded:
    """A job reached a terminal state (succeeded, failed, cancelled). Emitted by
    `apps.jobs.services.transition_job`; the result cache settles the job's followers."""

    job: Any = field(compare=False)  # apps.jobs.models.Job, as it is after the transition

    @property
    def job_id(self) -> Any:
        return self.job.pk


@dataclass(frozen=True)
class JobRequeued:
    """A job that had ended is back in the queue (support staff's requeue, an array's
    requeue-failed). Emitted by `apps.jobs.services.job_requeue` in its transaction; its array's
    end is to come again, and what its end decided for its dependents that have not started is
    undone (in-transaction handlers, docs/pipelines.md)."""

    job: Any = field(compare=False)  # apps.jobs.models.Job, queued again


@dataclass(frozen=True)
class ArrayEnded:
    """A job array's last task ended, or its last tasks ended without a row (cancelled, failed
    by a dependency). Emitted by `apps.jobs.arrays.check_ended` in its transaction; the
    dependencies on the array are decided there (an in-transaction handler)."""

    array_id: Any


@dataclass(frozen=True)
class DispatchWanted:
    """Something changed that may let a queued job start (a submit, a finish, a node back).
    Emitted by jobs, nodes and admission; the scheduler requests a dispatcher pass.
    `after_submit`: only new jobs came (no capacity freed), which a full cluster may answer a
    little later."""

    after_submit: bool = False


@dataclass(frozen=True)
class AttemptPlaced:
    """The dispatcher placed a job: an attempt waits for its agents. Emitted by
    `apps.jobs.services.job_place`; the scheduler sends each member's node a start message."""

    attempt: Any = field(compare=False)  # apps.jobs.models.JobAttempt
    nodes: tuple[str, ...] = ()  # each member's node name, by rank (a start message per member)
    # Each member's assignment (agent_protocol.Assignment), by rank, and the agent instance of
    # its node when placed: its start message is signed for that agent. Empty: names only.
    assignments: tuple = field(default=(), compare=False)
    agents: tuple[str, ...] = ()

    @property
    def attempt_id(self) -> Any:
        return self.attempt.pk


@dataclass(frozen=True)
class StopRequested:
    """An attempt's member must stop (`attempt.stop_requested` says why). Emitted by
    `apps.jobs.services.request_stop`, once per member; the scheduler sends that member's node
    a stop message (the agent's poll of the database is the backstop)."""

    attempt: Any = field(compare=False)  # apps.jobs.models.JobAttempt
    member: Any = field(compare=False)  # apps.jobs.models.AttemptMember, its node loaded


@dataclass(frozen=True)
class NodeAlive:
    """A node's agent heartbeated. Emitted by `apps.nodes.services.node_heartbeat` inside its
    transaction; jobs renew the leases of the attempts still running there until `lease_until`
    (an in-transaction handler)."""

    node_id: int
    lease_until: datetime


@dataclass(frozen=True)
class NodeLost:
    """A node's agent is gone (no heartbeat, or a new agent instance registered): what ran
    there is lost. Emitted by `apps.nodes.services` inside its transaction; jobs end the
    attempts on the node in the same transaction (an in-transaction handler)."""

    node_id: int
    reason: str


@dataclass(frozen=True)
class DrainOverdue:
    """Draining nodes passed their deadline: what still runs there must be preempted.
    Emitted by `apps.nodes.services.preempt_past_drain_deadline`; jobs preempt them in the
    transaction and return the preempted job ids (an in-transaction handler)."""

    node_ids: tuple[int, ...]
    reason: str = "its node is drained"


@dataclass(frozen=True)
class GpuSamplesWanted:
    """The event streams' poller (apps/jobs/event_hub.py) asks for the GPU samples of the running
    jobs it watches, newer than `after[job id]` (Unix time). Answered in the asker's thread
    (an in-transaction handler, apps/telemetry): `{job id: [sample, ...]}`, in time order."""

    after: dict = field(compare=False)


# --- the bus --------------------------------------------------------------------------------

Handler = Callable[[Any], Any]
_after_commit: dict[type, list[Handler]] = defaultdict(list)
_in_transaction: dict[type, list[Handler]] = defaultdict(list)


def subscribe(event_type: type, handler: Handler, *, in_transaction: bool = False) -> None:
    """Call `handler(event)` for every event of `event_type` (see the module's docstring for
    the two kinds). Subscribing the same handler twice keeps one (ready() may run again)."""
    handlers = (_in_transaction if in_transaction else _after_commit)[event_type]
    if handler not in handlers:
        handlers.append(handler)


def unsubscribe(event_type: type, handler: Handler) -> None:
    for table in (_in_transaction, _after_commit):
        if handler in table[event_type]:
            table[event_type].remove(handler)


def handlers_of(event_type: type) -> dict[str, list[Handler]]:
    """Who reacts to `event_type`, by kind (for tests and for reading)."""
    return {
        "in_transaction": list(_in_transaction[event_type]),
        "after_commit": list(_after_commit[event_type]),
    }


def emit(event: object) -> list:
    """Run the in-transaction handlers of `event` now and return their results; deliver it to
    the after-commit handlers once the current transaction commits."""
    results = [handler(event) for handler in list(_in_transaction[type(event)])]
    if _after_commit[type(event)]:
        collecting = getattr(_coalescing, "pending", None)
        if collecting is not None and isinstance(event, collecting[0]):
            collecting[1].setdefault(event, None)  # an ordered set: delivered at the block's end
        else:
            transaction.on_commit(lambda: deliver(event))
    return results


_coalescing = threading.local()


@contextmanager
def coalesced(*event_types: type) -> Iterator[None]:
    """Within the block (inside a transaction), equal events of `event_types` are delivered once
    after commit: collected as they are emitted and handed to `on_commit` when the block ends
    (not if it raises). A batch of agent reports, each end asking for a dispatch pass, asks once.
    Only for events whose equality says "the same effect" (DispatchWanted); never for events
    whose fields are left out of their comparison."""
    outer = getattr(_coalescing, "pending", None)
    pending: dict = {}
    _coalescing.pending = (event_types, pending)
    try:
        yield
    finally:
        _coalescing.pending = outer
    for event in pending:
        transaction.on_commit(functools.partial(deliver, event))


def deliver(event: object) -> None:
    """Run the after-commit handlers of `event` now, each on its own: one that raises is logged
    and the rest still run (what it failed to do is repaired by a later tick or poll)."""
    for handler in list(_after_commit[type(event)]):
        try:
            handler(event)
        except Exception:
            log.exception("handler %s of %s failed; the reconcile tick repairs what it missed",
                          getattr(handler, "__qualname__", handler), type(event).__name__)  # fmt: skip
