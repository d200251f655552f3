"""The scheduler's answers to what the apps below it emit (apps/platform/events.py), all after
commit: a dispatch request, and the start and stop messages to node agents. Each is a hint
that a tick repairs when lost (the beat's dispatch pass, the agent's poll)."""

from apps.platform import events
from apps.scheduling import publish, tasks


def request_dispatch(event: events.DispatchWanted) -> None:
    tasks.request_dispatch(after_submit=event.after_submit)


def publish_start(event: events.AttemptPlaced) -> None:
    publish.publish_start(event.attempt, event.nodes, event.assignments, event.agents)


def publish_stop(event: events.StopRequested) -> None:
    publish.publish_stop(event.attempt, event.member)
