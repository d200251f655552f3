"""The idle-GPU policy (docs/telemetry.md): a job whose every GPU read idle for its tier's warn
time gets one `gpu.idle` event per idle stretch (its event stream, its webhooks, its logs); at the
tier's action time it is requeued from its checkpoint (the attempt ends `preempted`) or
cancelled, its reason naming the idle minutes and the limit. A job requeued for idleness
`max_preemptions` times is cancelled instead. The tier's minimum runtime does not delay it.

A GPU is idle while it reads below GPUPLATFORM_GPU_IDLE_UTIL and its member's interactive
sessions (a shell, an exec, a forwarded port; on any rank of a gang) carry nothing: a sample
taken while a session carried a byte either way (the agent marks it `active`, ingest.py) ends
the idle stretch as a busy one would, so a person typing in a shell on an idle GPU is neither
warned nor cancelled.

Minutes are GPUPLATFORM_GPU_IDLE_MINUTE_SECONDS long (60; tests shorten them)."""

from __future__ import annotations

import logging

from django.conf import settings

from apps.jobs.models import AttemptMember, Job, JobAttempt, JobState
from apps.jobs.services import job_cancel, job_preempt, record_event
from apps.platform.errors import ServiceError
from apps.platform.names import GPU_IDLE_KIND
from apps.telemetry.models import GpuSeries, JobGpuSummary
from apps.tenants.models import IdleAction

log = logging.getLogger(__name__)
ACTOR = "system:gpu-idle"


def evaluate(job: Job, attempt: JobAttempt, summary: JobGpuSummary) -> None:
    """After new samples of `attempt` (its summary locked and saved by the caller)."""
    rows = list(GpuSeries.objects.filter(attempt=attempt).values_list("idle_since", "last_t"))
    expected = sum(
        len(indices)
        for indices in AttemptMember.objects.filter(attempt=attempt).values_list(
            "gpu_indices", flat=True
        )
    )
    idle_since = [since for since, _ in rows if since is not None]
    if not rows or len(rows) < expected or len(idle_since) < len(rows):
        return
    start = max(idle_since)  # every GPU idle since then
    upto = min(last for _, last in rows)  # ... up to the newest time all of them were read
    if upto <= start:
        return
    counted = max(summary.idle_counted_to or start, start)
    if upto > counted:
        summary.idle_seconds += upto - counted
        summary.idle_counted_to = upto
    _apply_policy(job, attempt, summary, start=start, idle=upto - start)


def _apply_policy(job: Job, attempt: JobAttempt, summary: JobGpuSummary, *, start: float,
                  idle: float) -> None:  # fmt: skip
    tier = job.tier
    minute = settings.GPU_IDLE_MINUTE_SECONDS
    warn, limit, action = tier.gpu_idle_warn_minutes, tier.gpu_idle_minutes, tier.gpu_idle_action
    acts = action != IdleAction.NONE and limit is not None
    due_warn = warn is not None and idle >= warn * minute
    due_act = acts and idle >= limit * minute  # type: ignore[operator]
    if (due_warn or due_act) and summary.idle_warned_for != start:
        summary.idle_warned_for = start
        shown = limit if acts else warn
        data = {"job": str(job.pk), "idle_minutes": round(idle / minute, 1),
                "limit_minutes": shown, "action": action if acts else IdleAction.NONE}  # fmt: skip
        what = f"then {action}" if acts else "no action"
        record_event(job, kind=GPU_IDLE_KIND, actor=ACTOR, attempt=attempt, data=data,
                     reason=f"every GPU idle for {data['idle_minutes']} minutes "
                            f"(the {tier.name} tier's limit: {shown} minutes, {what})")  # fmt: skip
        log.warning("job %s: its GPUs idle for %.1f minutes", job.pk, idle / minute)
    if not due_act or summary.idle_acted_for == start or job.state != JobState.RUNNING:
        return
    summary.idle_acted_for = start
    minutes = f"{idle / minute:.1f}"
    reason = f"GPUs idle for {minutes} minutes (the {tier.name} tier's limit is {limit} minutes)"
    try:
        if action == IdleAction.REQUEUE and summary.idle_requeues < tier.max_preemptions:
            job_preempt(job=job, actor=ACTOR, reason=f"{reason}; requeued from its checkpoint")
            summary.idle_requeues += 1
        else:
            if action == IdleAction.REQUEUE:
                reason += f"; already requeued {summary.idle_requeues} times for idleness"
            job_cancel(job=job, actor=ACTOR, reason=reason)
    except ServiceError as error:  # it changed meanwhile (ended, preempted): nothing to do
        log.info("job %s: idle %s skipped (%s)", job.pk, action, error)
