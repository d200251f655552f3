"""Tasks consumed by node agents on their own queue (`node.<name>`). Thin hand-offs: the
long-running job lives in the agent's runner, so a task never outlives the broker's visibility
timeout and a redelivered one is a no-op (the runner launches a member once).

Anyone who can write to the broker could forge a message. A dispatcher pass's start message
carries its members' assignments signed with this agent's key (apps/platform/agent_protocol.py,
"signed start messages"): those start at once. Any other message is only a hint, acted on after
the agent API confirms that this (attempt, rank, token) is placed on this node (and, for a stop,
that the platform asked it to stop). A forged start or stop changes nothing."""

import hmac
import logging
import re
import time

from apps.platform import agent_protocol as wire
from apps.platform.names import Task
from apps.scheduling.queues import START_ATTEMPT_TASK, START_ATTEMPTS_TASK, STOP_ATTEMPT_TASK
from workers.celery_app import app

log = logging.getLogger(__name__)


def _agent():
    from workers import current

    if current.AGENT is None:
        log.warning("node task received outside a node agent; ignored")
    return current.AGENT


def _confirmed(agent, attempt_id: int, rank: int, token: str):
    """The member's assignment if the platform has it on this node under this token, else None."""
    from workers.agent_client import ApiError

    try:
        work = agent.api.assignment(attempt_id, rank, str(token))
    except ApiError as error:
        log.warning("could not check the message for attempt %s rank %s (%s); the next sync repairs it",
                    attempt_id, rank, error)  # fmt: skip
        return None
    if work is None or not hmac.compare_digest(work.token, str(token)):
        log.warning("message for attempt %s rank %s is not for a member placed here with that token; ignored",
                    attempt_id, rank)  # fmt: skip
        return None
    return work


@app.task(name=START_ATTEMPT_TASK, ignore_result=True)
def start_attempt(attempt_id: int, rank: int, token: str) -> None:
    agent = _agent()
    if agent is None:
        return
    work = _confirmed(agent, attempt_id, rank, token)
    if work is None:
        return
    if not work.active:
        log.info("attempt %s rank %s is no longer active; not starting it", attempt_id, rank)
        return
    agent.runner.launch(work)


@app.task(name=START_ATTEMPTS_TASK, ignore_result=True)
def start_attempts(members: list, signed: str | None = None, signature: str | None = None) -> None:
    """What one dispatcher pass placed on this node: `[{"attempt_id", "rank", "token"}, ...]`,
    and (`signed`, `signature`) their assignments signed for this agent, which start without a
    request. Unsigned, or signed with another key (forged, an earlier agent's, expired), one
    request checks them all (`GET /assignments/?attempts=...`, this node's members of those
    attempts only); each member starts only if the platform has it here, active, under the token
    the message names. Anything else in the message (forged, stale, another node's) is ignored."""
    from workers.agent_client import ApiError

    agent = _agent()
    if agent is None:
        return
    if signed is not None and agent.message_key:
        try:
            works = wire.open_start_message(agent.message_key, signed, signature, node=agent.args.node,
                                            agent_instance=agent.instance, now=time.time())  # fmt: skip
        except (wire.BadStartMessage, ValueError, KeyError, TypeError) as error:
            log.warning("a signed start message does not hold (%s); checking its members with the platform",
                        error)  # fmt: skip
        else:
            for work in works:
                if work.active:
                    agent.runner.launch(work)
            return
    try:
        wanted = [(int(m["attempt_id"]), int(m["rank"]), str(m["token"])) for m in members]
    except (TypeError, KeyError, ValueError):
        log.warning("malformed start message ignored")
        return
    if not wanted:
        return
    try:
        placed = agent.api.assignments(attempts=[attempt_id for attempt_id, _, _ in wanted])
    except ApiError as error:
        log.warning("could not check a start message for %d member(s) (%s); the next sync repairs it",
                    len(wanted), error)  # fmt: skip
        return
    for attempt_id, rank, token in wanted:
        work = placed.get((attempt_id, rank))
        if work is None or not hmac.compare_digest(work.token, token):
            log.warning("message for attempt %s rank %s is not for a member placed here with that token; ignored",
                        attempt_id, rank)  # fmt: skip
            continue
        if not work.active:
            log.info("attempt %s rank %s is no longer active; not starting it", attempt_id, rank)
            continue
        agent.runner.launch(work)


@app.task(name=STOP_ATTEMPT_TASK, ignore_result=True)
def stop_attempt(attempt_id: int, rank: int, token: str, why: str = "stop") -> None:
    agent = _agent()
    if agent is None or (attempt_id, rank) not in agent.runner.runs:
        return
    work = _confirmed(agent, attempt_id, rank, token)
    if work is None:
        return
    if not work.stop_requested:
        log.warning("stop message for attempt %s rank %s, which the platform did not ask to stop; ignored",
                    attempt_id, rank)  # fmt: skip
        return
    agent.runner.stop(
        attempt_id, rank, work.stop_requested
    )  # the platform's reason, not the message's


@app.task(name=Task.OPEN_SESSION, ignore_result=True)
def open_session(session: str) -> None:
    """A session waits for this node (workers/sessions.py): dial the web for it. The web gives
    its spec only to this node's credential, and only for a session opened on this node."""
    agent = _agent()
    if agent is None or not isinstance(session, str) or not re.fullmatch(r"[0-9a-f]{32}", session):
        return
    agent.sessions.open_session(session)
