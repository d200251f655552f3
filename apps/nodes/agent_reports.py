"""The agents' reports (`/internal/agent/v1/reports/` and a member's `started/`, `progress/`,
`finished/`, `lost/`): their bodies, checked, and the services they call; a batch's plain starts
and clean ends together (apps/jobs/batch_reports.py). Split from apps/nodes/agent_api.py, whose
authentication and `AgentView` they use."""

from __future__ import annotations

import hmac
import logging
import threading
from collections.abc import Iterator, Mapping
from functools import cache
from typing import Any, cast

from django.db import DatabaseError, transaction
from rest_framework import serializers
from rest_framework.exceptions import (
    ValidationError,
)
from rest_framework.response import Response

from apps.jobs import batch_reports
from apps.jobs import services as jobs
from apps.jobs.models import AttemptMember, JobAttempt
from apps.jobs.transitions import BatchRefused
from apps.nodes.agent_api import AgentView
from apps.platform import agent_protocol as wire
from apps.platform import events
from apps.platform.retry import retried, retryable, run_retried

log = logging.getLogger(__name__)


class CheckpointReport(serializers.Serializer):
    """A checkpoint a report names must be one this job stored through this API: a node must not
    point a job at another job's checkpoint (its next attempt would download it)."""

    checkpoint = serializers.CharField(max_length=500, allow_blank=True, default="")

    def validate_checkpoint(self, value: str) -> str:
        prefix = f"checkpoints/{self.context['job_id']}/"
        if value and (not value.startswith(prefix) or ".." in value.split("/")):
            raise serializers.ValidationError(
                f"must be a checkpoint stored for this job ({prefix}...) or empty"
            )
        return value


class ProgressReport(CheckpointReport):
    progress = serializers.FloatField(min_value=0, max_value=1)


class FinishedReport(CheckpointReport):
    exit_code = serializers.IntegerField(allow_null=True, min_value=-255, max_value=255)
    reason = serializers.CharField(max_length=300, allow_blank=True, default="")
    # False: what failed is the job's own input (its bundle, its environment, a deleted secret:
    # docs/own-code.md), which no retry changes, even for a job with retry_on_failure.
    retryable = serializers.BooleanField(default=True)


class StartedReport(serializers.Serializer):
    pid = serializers.IntegerField(min_value=0)
    master_port = serializers.IntegerField(min_value=1, max_value=65535, required=False)


class LostReport(serializers.Serializer):
    reason = serializers.CharField(max_length=300)


# Each report kind's service call, one function used by the single endpoints and the batch: the
# member is this node's and the token its attempt's (the caller checked both on the member as
# jobs.lock_reported_members read it, after its job's lock, in the transaction the service
# changes it in); the guarded updates are the last word (a stale report changes nothing).


def _started(reported: jobs.ReportedMember, data: dict) -> bool:
    attempt = reported.member.attempt  # rank 0's port, once: the other members wait for it
    if reported.member.rank == 0 and data.get("master_port") and attempt.master_port is None:
        JobAttempt.objects.filter(pk=attempt.pk, master_port=None).update(
            master_port=data["master_port"]
        )
        attempt.master_port = data["master_port"]
    return jobs.member_started(reported, pid=data["pid"])


def _progress(reported: jobs.ReportedMember, data: dict) -> bool:
    return jobs.member_progress(reported, progress=data["progress"], checkpoint=data["checkpoint"])


def _finished(reported: jobs.ReportedMember, data: dict) -> bool:
    # The attempt's checkpoint is its rank 0's: each other rank's is found beside it (apps/jobs/checkpoints.py).
    checkpoint = data["checkpoint"] if reported.member.rank == 0 else ""
    return jobs.member_finished(reported, exit_code=data["exit_code"], reason=data["reason"],
                                checkpoint=checkpoint, retryable=data["retryable"])  # fmt: skip


def _lost(reported: jobs.ReportedMember, data: dict) -> bool:
    return jobs.member_lost(reported, reason=data["reason"])


REPORTS = {"started": (StartedReport, _started), "progress": (ProgressReport, _progress),
           "finished": (FinishedReport, _finished), "lost": (LostReport, _lost)}  # fmt: skip


def _report_body(kind: str, member: AttemptMember, data) -> serializers.Serializer:
    """The kind's fields, validated against the member's job (a checkpoint must be its own)."""
    body, _ = REPORTS[kind]
    return body(data=data, context={"job_id": member.attempt.job_id})


class ReportView(AgentView):
    """POST a member's `kind` report (`/members/<attempt>/<rank>/<kind>/`, token in
    `X-Attempt-Token`): `{"accepted": bool}`; the batch endpoint below carries several."""

    kind = ""

    def post(self, request, attempt_id: int, rank: int):
        member = self.member(attempt_id, rank)  # this node's, under its attempt's token
        body = _report_body(self.kind, member, request.data)
        body.is_valid(raise_exception=True)
        _, apply = REPORTS[self.kind]

        @retried  # a deadlock PostgreSQL broke: the report again, whole (apps/platform/retry.py)
        @transaction.atomic
        def report() -> bool:
            locked = jobs.lock_reported_members(attempt_ids=[attempt_id], node_name=self.node_name)
            reported = locked.get((attempt_id, rank))
            return reported is not None and apply(reported, body.validated_data)

        return Response({"accepted": report()})


class StartedView(ReportView):
    kind = "started"


class ProgressView(ReportView):
    kind = "progress"


class FinishedView(ReportView):
    kind = "finished"


class LostView(ReportView):
    kind = "lost"


class ReportItem(serializers.Serializer):
    """One member's report in a batch: the member, its attempt's token (what `X-Attempt-Token`
    carries on the single endpoints) and the kind; the kind's own fields sit beside these."""

    attempt_id = serializers.IntegerField(min_value=1)
    rank = serializers.IntegerField(min_value=0)
    token = serializers.CharField(max_length=64)
    kind = serializers.ChoiceField(choices=wire.REPORT_KINDS)


class _ThisThread(Mapping):
    """A serializer's `context` that each thread sets for itself: the context of the batch's
    serializers (`_check`), which every thread of the process shares."""

    def __init__(self) -> None:
        self._local = threading.local()

    def set(self, **values: Any) -> None:
        self._local.values = values

    def _values(self) -> dict:
        return getattr(self._local, "values", {})

    def __getitem__(self, key: str) -> Any:
        return self._values()[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._values())

    def __len__(self) -> int:
        return len(self._values())


_BODY = _ThisThread()  # the job the item being checked is about (a checkpoint must be its own)


@cache
def _check(serializer_class: type[serializers.Serializer]) -> serializers.Serializer:
    """One instance of the serializer for every batch item of this process, for `_checked`: DRF
    deep-copies a serializer's declared fields into each instance it makes (a fifth of a quick
    job's call went on making three a call). `run_validation` keeps nothing on the instance (no
    `is_valid`, no `initial_data`, `validated_data` or `errors`); the fields are bound here,
    before any thread shares it; the kinds' context is the thread's own (`_BODY`)."""
    # DRF only keeps the context and reads it (typed as a dict: any mapping serves).
    serializer = serializer_class(context=cast(dict[str, Any], _BODY))
    _ = serializer.fields  # DRF builds and binds them on first use: now, before threads share it
    return serializer


class ReportsView(AgentView):
    """POST `{"reports": [{"attempt_id", "rank", "token", "kind", ...the kind's fields}, ...]}`:
    several members' started / progress / finished / lost reports in one call, applied in one
    transaction through the same guarded services as the single endpoints. Each item is fenced on
    its own: one that is not this node's member under that token answers `{"status": 404}` and
    changes nothing, one with bad fields `{"status": 400, "errors": {...}}`; the others still
    apply. The answer's `results` are in the order of `reports`, each `{"status": 200,
    "accepted": bool}` when it reached its service."""

    def post(self, request):
        items = request.data.get("reports") if isinstance(request.data, dict) else None
        if not isinstance(items, list) or not items:
            raise ValidationError({"reports": ["a non-empty list of reports"]})
        if len(items) > wire.MAX_REPORTS_PER_CALL:
            raise ValidationError(
                {"reports": [f"at most {wire.MAX_REPORTS_PER_CALL} reports a call"]}
            )
        heads: list[dict | None] = []
        results: list[dict | None] = [None] * len(items)
        check = _check(ReportItem)
        for i, item in enumerate(items):
            head, errors = _checked(check, item if isinstance(item, dict) else {})
            heads.append(head)
            if errors is not None:
                results[i] = {"status": 400, "errors": errors}

        # The batch's transaction, run again whole where PostgreSQL broke a deadlock in it
        # (apps/platform/retry.py): every item read again, nothing of the aborted try kept. A
        # group of reports that met a row moved since its read (rare) refuses the whole try,
        # which runs again with every report through its service alone.
        def apply(together: bool) -> list:
            return run_retried(lambda: self._apply_all(items, heads, list(results), together),
                               what="agent reports")  # fmt: skip

        try:
            answered = apply(together=True)
        except BatchRefused:
            answered = apply(together=False)
        return Response({"results": answered})

    def _apply_all(self, items: list, heads: list[dict | None], results: list[dict | None],
                   together: bool) -> list:  # fmt: skip
        # One dispatch request for the batch, however many of its reports free GPUs.
        with transaction.atomic(), events.coalesced(events.DispatchWanted):
            # The batch's jobs locked (in id order), then their members read: two statements
            # for the whole batch, and the services read nothing more.
            members = jobs.lock_reported_members(
                attempt_ids={h["attempt_id"] for h in heads if h is not None},
                node_name=self.node_name,
            )
            # Jobs in id order, each job's reports in the order sent (a start before its end).
            order = []
            for i, head in enumerate(heads):
                if head is None:
                    continue
                reported = members.get((head["attempt_id"], head["rank"]))
                token = str(reported.member.attempt.token) if reported else ""
                if reported is None or not hmac.compare_digest(token, head["token"]):
                    results[i] = {"status": 404}
                    continue
                order.append((reported.member.attempt.job_id, i))
            bodies: dict[int, dict] = {}
            for _, i in sorted(order):
                head = cast(dict, heads[i])
                _BODY.set(job_id=members[_key(head)].member.attempt.job_id)
                body, errors = _checked(_check(REPORTS[head["kind"]][0]), items[i])
                if errors is None:
                    bodies[i] = cast(dict, body)
                else:
                    results[i] = {"status": 400, "errors": errors}
            if together:
                _apply_together(heads, bodies, members, results)
            for i, data in bodies.items():  # in the order above
                if results[i] is None:
                    head = cast(dict, heads[i])
                    results[i] = self._apply(members[_key(head)], head, data)
        return results

    def _apply(self, reported: jobs.ReportedMember, head: dict, data: dict) -> dict:
        member = reported.member
        _, apply = REPORTS[head["kind"]]
        # Each service is atomic: inside the batch's transaction, a savepoint, so one item's
        # failure rolls back that item only (its objects may then be ahead of the rows: the
        # guarded updates refuse whatever a later item of this batch bases on them).
        try:
            accepted = apply(reported, data)
        except DatabaseError as error:
            if retryable(error):  # the whole batch's transaction was chosen: it runs again
                raise
            log.exception("report %s of attempt %s rank %s failed", head["kind"], member.attempt_id,
                          member.rank)  # fmt: skip
            return {"status": 500}
        except Exception:
            log.exception("report %s of attempt %s rank %s failed", head["kind"], member.attempt_id,
                          member.rank)  # fmt: skip
            return {"status": 500}
        return {"status": 200, "accepted": accepted}


def _checked(serializer: serializers.Serializer, data) -> tuple[dict | None, dict | None]:
    """(validated data, None) or (None, errors): what `serializer(data=data).is_valid()` gives,
    from one serializer instance used for each item of every batch (`_check`)."""
    try:
        return serializer.run_validation(data), None
    except ValidationError as error:
        return None, cast(dict, error.detail)


def _ends_plainly(head: dict, data: dict, reported: jobs.ReportedMember) -> bool:
    """Whether this report is an end the services would call clean: exit code 0, no reason, no
    checkpoint, nothing asked to stop (jobs.ends_plainly)."""
    return head["kind"] == "finished" and jobs.ends_plainly(
        reported, exit_code=data["exit_code"], reason=data["reason"], checkpoint=data["checkpoint"]
    )


def _key(head: dict) -> tuple[int, int]:
    return head["attempt_id"], head["rank"]


def _apply_together(heads: list, bodies: dict[int, dict], members: dict, results: list) -> None:
    """The batch's plain starts followed by their clean ends, its other plain starts, then its
    clean ends, each group in a few statements (apps/jobs/batch_reports.py), even a group of one
    (no savepoint of its own: two statements fewer than its service's); what it applies is
    answered in `results`, the rest is left for the services one by one. A member's reports keep
    their order: a member's start goes with a group only as its first report here, its end only
    as its first or right after a start that went with a group. A group that meets a row moved
    since its read raises BatchRefused (the caller runs the call again without groups)."""
    sequences: dict[tuple[int, int], list[int]] = {}
    for i in bodies:
        sequences.setdefault(_key(heads[i]), []).append(i)
    done: set[int] = set()
    starts, ran = [], []
    for key, sequence in sequences.items():
        first = sequence[0]
        if heads[first]["kind"] == "started" and not bodies[first].get("master_port"):
            if jobs.starts_plainly(members[key]):
                after = sequence[1] if len(sequence) > 1 else None
                if after is not None and _ends_plainly(heads[after], bodies[after], members[key]):
                    ran.append((first, after, members[key], bodies[first]["pid"]))
                else:
                    starts.append((first, members[key], bodies[first]["pid"]))
    # A start with its clean end right behind it (a quick job: the drain's usual call), in one
    # write for both.
    if ran:
        batch_reports.members_ran_together([(r, pid) for _, _, r, pid in ran])
        done.update(i for pair in ran for i in pair[:2])
    if starts:
        batch_reports.members_started_together([(r, pid) for _, r, pid in starts])
        done.update(i for i, _, _ in starts)
    ends = []
    for key, sequence in sequences.items():
        pending = [i for i in sequence if i not in done]  # the first: all before it are done
        if not pending:
            continue
        i = pending[0]
        if _ends_plainly(heads[i], bodies[i], members[key]):
            ends.append((i, members[key]))
    if ends:
        batch_reports.members_finished_together([r for _, r in ends])
        done.update(i for i, _ in ends)
    for i in done:
        results[i] = {"status": 200, "accepted": True}
