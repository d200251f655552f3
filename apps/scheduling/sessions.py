"""Interactive sessions (docs/interactive.md): who may open a shell, an exec or a forwarded port on
which job, the session's record in Redis (where the relay of any web process finds it:
gpuplatform/relay.py), the caps per user and per tenant, the audit events, and the hint that
sends the job's node agent dialling out to the web for it.

A session is opened by an ordinary API request (`POST /api/v1/jobs/{id}/sessions/`), so the
token, the tenant and the role are checked as for any request; the answer is a one-time ticket
for the client's websocket. The agent's leg proves itself with its node credential, and takes
only a session addressed to its own node.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import secrets
import uuid
from dataclasses import dataclass
from typing import cast

from celery import current_app
from django.conf import settings
from django.db import transaction

from apps.jobs import stream_slots
from apps.jobs.access import membership_of, visible_jobs
from apps.jobs.models import ATTEMPT_ACTIVE, AttemptMember, Job, JobState
from apps.jobs.services import record_event
from apps.platform.errors import NotAllowed, NotRunning, ServiceError, UnknownObject
from apps.platform.names import Task, node_queue
from apps.platform.redis import shared_client
from apps.tenants.models import Role

log = logging.getLogger(__name__)

SHELL, EXEC, FORWARD = "shell", "exec", "forward"
KINDS = (SHELL, EXEC, FORWARD)
PREFIX = "gpuplatform:session:"
SLOTS = "gpuplatform:sessions:"
PENDING_SECONDS = 60  # a session nobody attached to lapses; the relay renews an open one
LEASE_SECONDS = 30  # a slot's lease, renewed by the relay while the session is open
RETRY_AFTER_SECONDS = 5
DEFAULT_SHELL = ["/bin/bash", "-l"]  # the agent falls back to /bin/sh where there is no bash


class OverSessionCap(ServiceError):
    status = 429


@dataclass(frozen=True)
class Request:
    """What the client asks for (validated by the view)."""

    kind: str
    rank: int = 0
    argv: tuple[str, ...] = ()
    tty: bool = False
    rows: int = 24
    cols: int = 80
    term: str = "xterm-256color"
    port: int = 0


@dataclass(frozen=True)
class Opened:
    session: str
    ticket: str  # the client's websocket presents it once (gpuplatform/relay.py)
    node: str


def key(session: str) -> str:
    return f"{PREFIX}{session}"


def ticket_digest(ticket: str) -> str:
    return hashlib.sha256(ticket.encode()).hexdigest()


def open_session(*, user, token_id, job_id, request: Request) -> Opened:
    """Authorise, take a slot, record the start, and ask the node's agent to dial in."""
    job = _job(user, job_id)
    staff = _authorise(user, job, request.kind)
    member = _member(job, request.rank)
    session = uuid.uuid4().hex
    slot_keys = _take_slot(user_id=user.pk, tenant_id=job.tenant_id, member=session)
    ticket = secrets.token_urlsafe(24)
    who = user.get_username() + (" (support staff)" if staff else "")
    spec = {
        "session": session, "kind": request.kind, "job_id": str(job.pk),
        "attempt_id": member.attempt_id, "rank": member.rank, "token": str(member.attempt.token),
        "argv": list(request.argv) or _default_argv(job, request.kind), "tty": request.tty,
        "rows": request.rows, "cols": request.cols, "term": request.term, "port": request.port,
        "ends_job": request.kind == SHELL and job.interactive,
    }  # fmt: skip
    record = {
        "spec": json.dumps(spec), "node": member.node.name, "ticket": ticket_digest(ticket),
        "token_id": "" if token_id is None else str(token_id), "job_id": str(job.pk),
        "who": who, "kind": request.kind, "rank": str(member.rank),
        "slots": json.dumps(slot_keys),
    }  # fmt: skip
    conn = shared_client()
    pipe = conn.pipeline()
    pipe.hset(key(session), mapping=record)
    pipe.expire(key(session), PENDING_SECONDS)
    pipe.execute()
    record_event(job, actor=who, kind="session", reason=f"{request.kind} session opened by {who}"
                 + (f" on rank {member.rank}" if job.nodes > 1 else ""),
                 data={"session": session, "kind": request.kind, "rank": member.rank,
                       "user": user.get_username(), "staff": staff, "event": "start"})  # fmt: skip
    if staff:
        log.warning("support staff %s opened a %s session on job %s", who, request.kind, job.pk)
    node = member.node.name
    transaction.on_commit(lambda: _ask_agent(node, session))
    return Opened(session=session, ticket=ticket, node=member.node.name)


def _job(user, job_id) -> Job:
    job = visible_jobs(user).select_related("tenant").filter(pk=job_id).first()
    if job is None:
        raise UnknownObject("no such job", field="job")
    return job


def _authorise(user, job: Job, kind: str) -> bool:
    """True when support staff attach (audited); refusals raise. A tenant admin may open a
    session on any job of the tenant, a member on their own jobs, a viewer on none."""
    membership = membership_of(user)
    if membership is None or membership.tenant_id != job.tenant_id:
        if not (user.is_staff and settings.STAFF_CAN_ATTACH):
            raise NotAllowed("support staff may not attach to a tenant's job here "
                             "(the operator allows it with GPUPLATFORM_STAFF_CAN_ATTACH=1)")  # fmt: skip
        return True
    if membership.role == Role.VIEWER:
        raise NotAllowed("a viewer may not open sessions")
    if membership.role != Role.ADMIN and job.user_id != user.pk:
        raise NotAllowed("a member may open sessions only on their own jobs")
    if kind in (SHELL, EXEC) and not job.tenant.allow_commands:
        raise NotAllowed(f"tenant {job.tenant.slug} may not run commands", field="kind")
    if kind == SHELL and not job.interactive:
        raise ServiceError("a shell is for an interactive job; use exec for this one", field="kind")
    return False


def _member(job: Job, rank: int) -> AttemptMember:
    if job.state != JobState.RUNNING:
        raise NotRunning(f"job {job.pk} is {job.state}, not running", field="job")
    member = (
        AttemptMember.objects.select_related("node", "attempt")
        .filter(attempt__job=job, attempt__state__in=ATTEMPT_ACTIVE, rank=rank, ended_at=None)
        .first()
    )
    if member is None:
        raise ServiceError(f"job {job.pk} has no running rank {rank} "
                           f"(ranks 0..{job.nodes - 1})", field="rank")  # fmt: skip
    return member


def _default_argv(job: Job, kind: str) -> list[str]:
    if kind == SHELL:
        return list(job.command or DEFAULT_SHELL)
    return []


def _take_slot(*, user_id, tenant_id, member: str) -> list[str]:
    keys = [f"{SLOTS}user:{user_id}", f"{SLOTS}tenant:{tenant_id}"]
    caps = (settings.MAX_SESSIONS_PER_USER, settings.MAX_SESSIONS_PER_TENANT)
    answer = stream_slots.take(keys, member, lease=LEASE_SECONDS, caps=caps)  # as event streams'
    if answer:
        scope = "user" if answer == 1 else "tenant"
        raise OverSessionCap(f"too many open sessions for this {scope} "
                             f"(at most {caps[answer - 1]})", retry_after=RETRY_AFTER_SECONDS)  # fmt: skip
    return keys


def _ask_agent(node: str, session: str) -> None:
    """A hint: the agent dials the web and takes the session only if it is for its own node."""
    try:
        current_app.send_task(Task.OPEN_SESSION, kwargs={"session": session}, queue=node_queue(node),
                              retry=False, expires=PENDING_SECONDS, declare=[])  # fmt: skip
    except Exception:
        log.warning("could not ask node %s's agent for session %s", node, session, exc_info=True)


# --- what the relay calls (from its thread pool) ---------------------------------------------------


def renew(sessions: list[tuple[str, list[str]]]) -> None:
    """Keep open sessions' records and slots alive: (session, slot keys) each."""
    pipe = shared_client().pipeline(transaction=False)
    for session, slot_keys in sessions:
        pipe.expire(key(session), PENDING_SECONDS)
        stream_slots.renew_in(pipe, slot_keys, session, lease=LEASE_SECONDS)
    pipe.execute()


def check_ticket(session: str, ticket: str) -> dict | None:
    """The session's record if the ticket is its own and unused (it is spent now)."""
    conn = shared_client()
    stored = cast(dict[bytes, bytes], conn.hgetall(key(session)))
    record = {k.decode(): v.decode() for k, v in stored.items()}
    if not record or not record.get("ticket"):
        return None
    if not hmac.compare_digest(record["ticket"], ticket_digest(ticket)):
        return None
    if not conn.hdel(key(session), "ticket"):  # two sockets raced for one ticket: one wins
        return None
    return record


def session_ended(record: dict, session: str, why: str) -> None:
    """The audit event of the end, the slot back, the record gone."""
    conn = shared_client()
    pipe = conn.pipeline(transaction=False)
    for slot_key in json.loads(record.get("slots") or "[]"):
        pipe.zrem(slot_key, session)
    pipe.delete(key(session))
    pipe.execute()
    job = Job.objects.filter(pk=record["job_id"]).first()
    if job is not None:
        record_event(job, actor=record["who"], kind="session",
                     reason=f"{record['kind']} session of {record['who']} ended: {why}",
                     data={"session": session, "kind": record["kind"], "rank": int(record["rank"]),
                           "event": "end", "why": why})  # fmt: skip


def revoked_tokens(token_ids: set[str]) -> set[str]:
    """Which of these tokens may no longer be used (revoked, expired, deleted)."""
    from apps.tenants.models import ApiToken
    from apps.tenants.tokens import refusal

    ids = {int(t) for t in token_ids if t.isdigit()}
    alive = {str(token.pk) for token in ApiToken.objects.filter(pk__in=ids) if not refusal(token)}
    return {t for t in token_ids if t and t not in alive}
