"""The result cache and request coalescing for cacheable templates (`demo-infer`).

The key is the SHA-256 of the canonical JSON of template name, template version, params and
tenant: a version bump or another tenant never matches. A request whose params sample
(`temperature` > 0) without a `seed` is never cached.

- hit: a succeeded origin within the template's TTL -> a new job, already `succeeded`, with
  `cache_hit: true` and Artifact rows pointing at the origin's stored files; no attempt, no GPU.
- follower: an identical origin is queued or running -> a queued job the dispatcher holds back
  (reason names the origin); it ends when the origin ends (`job_ended`, on the JobEnded
  event that `transition_job` emits for every terminal state).
- origin: anything else; it runs like any job.

Cancelling a follower leaves the origin alone. Cancelling an origin with followers hands over:
the oldest follower becomes the origin and is dispatched. An origin that fails fails its
followers, naming it (the same input would fail the same way).
"""

from __future__ import annotations

import hashlib
import json
from datetime import timedelta

from django.conf import settings
from django.utils import timezone

from apps.admission.models import CachedJob, CacheRole, TemplateCachePolicy
from apps.jobs.models import JOB_ACTIVE, Artifact, Job, JobState
from apps.jobs.services import JobSpec, record_event, transition_job, trigger_dispatch
from apps.platform import events
from apps.tenants.models import Tenant

ACTOR = "system:result-cache"


def cache_key(spec: JobSpec, tenant: Tenant) -> str | None:
    """The cache key of a submission, or None when it must not be cached."""
    template = spec.template
    if template is None or not template.cacheable or not spec.cacheable or spec.command is not None:
        return None
    if spec.env or spec.secrets or spec.python or spec.bundle:
        return None  # not in the key: the same template and params could do something else
    params = spec.params or {}
    if (params.get("temperature") or 0) > 0 and params.get("seed") is None:
        return None  # sampling without a seed: every run may differ
    if ttl_seconds(template) == 0:
        return None
    canonical = json.dumps(
        {"template": template.name, "version": template.version, "params": params, "tenant": tenant.pk},
        sort_keys=True, separators=(",", ":"), ensure_ascii=False,
    )  # fmt: skip
    return hashlib.sha256(canonical.encode()).hexdigest()


def ttl_seconds(template) -> int:
    policy = (
        TemplateCachePolicy.objects.filter(template=template)
        .values_list("ttl_seconds", flat=True)
        .first()
    )
    return settings.RESULT_CACHE_TTL_SECONDS if policy is None else policy


def fresh_origin(tenant: Tenant, key: str, template) -> Job | None:
    """The newest succeeded origin with this key still within the template's TTL."""
    since = timezone.now() - timedelta(seconds=ttl_seconds(template))
    link = (
        CachedJob.objects.filter(
            tenant=tenant,
            key=key,
            role=CacheRole.ORIGIN,
            job__state=JobState.SUCCEEDED,
            job__finished_at__gte=since,
        )  # fmt: skip
        .select_related("job")
        .order_by("-job__finished_at")
        .first()
    )
    return link.job if link else None


def active_origin(tenant: Tenant, key: str) -> Job | None:
    link = (
        CachedJob.objects.filter(
            tenant=tenant, key=key, role=CacheRole.ORIGIN, job__state__in=JOB_ACTIVE
        )
        .select_related("job")
        .order_by("created_at")
        .first()
    )
    return link.job if link else None


# --- creating jobs -------------------------------------------------------------------------------


def link_hit(job: Job, *, tenant: Tenant, key: str, origin: Job) -> None:
    CachedJob.objects.create(job=job, tenant=tenant, key=key, role=CacheRole.HIT, source=origin)


def share_artifacts(origin: Job, job: Job) -> None:
    """New Artifact rows naming the same stored files: nothing is copied, nothing rewritten."""
    Artifact.objects.bulk_create(
        [
            Artifact(
                job=job, attempt=None, name=a.name, file=a.file.name, size=a.size, sha256=a.sha256
            )
            for a in origin.artifacts.all()
        ]  # fmt: skip
    )


def link_origin(job: Job, *, tenant: Tenant, key: str) -> None:
    CachedJob.objects.create(job=job, tenant=tenant, key=key, role=CacheRole.ORIGIN)


def link_follower(job: Job, *, tenant: Tenant, key: str, origin: Job) -> None:
    CachedJob.objects.create(
        job=job, tenant=tenant, key=key, role=CacheRole.FOLLOWER, source=origin
    )
    reason = follower_reason(job, origin_id=origin.pk)
    Job.objects.filter(pk=job.pk).update(reason=reason)
    job.reason = reason


def follower_reason(job: Job, origin_id=None) -> str:
    if origin_id is None:
        origin_id = CachedJob.objects.filter(job=job).values_list("source_id", flat=True).first()
    return f"joined identical job {origin_id}; finishes with it"


def queued_followers() -> dict:
    """{follower job id: origin job id}: jobs the dispatcher must not place (they run nothing
    of their own)."""
    return dict(
        CachedJob.objects.filter(role=CacheRole.FOLLOWER, job__state=JobState.QUEUED).values_list(
            "job_id", "source_id"
        )
    )


# --- the origin ends: settle its followers --------------------------------------------------------


def on_job_ended(event: events.JobEnded) -> None:
    """In-transaction handler of JobEnded (subscribed in apps/admission/apps.py): followers end
    with their origin in the same transaction, or not at all."""
    job_ended(event.job)


def job_ended(job: Job) -> None:
    """Any job reached a terminal state (transition_job emits JobEnded): settle its followers."""
    if not job.cacheable:
        return
    followers = list(
        Job.objects.filter(cache_link__source=job, cache_link__role=CacheRole.FOLLOWER, state=JobState.QUEUED)
        .order_by("created_at")
    )  # fmt: skip
    if not followers:
        return
    if job.state == JobState.SUCCEEDED:
        for follower in followers:
            _finish_follower_with(follower, job)
    elif job.state == JobState.CANCELLED:
        _hand_over(job, followers)
    else:
        for follower in followers:
            transition_job(follower, to=JobState.FAILED, expect=[JobState.QUEUED], actor=ACTOR,
                           reason=f"the identical job {job.pk} it joined failed: {job.reason}"[:300],
                           exit_code=job.exit_code, finished_at=timezone.now())  # fmt: skip


def _finish_follower_with(follower: Job, origin: Job) -> None:
    now = timezone.now()
    if transition_job(follower, to=JobState.SUCCEEDED, expect=[JobState.QUEUED], actor=ACTOR,
                      reason=f"result of identical job {origin.pk}", cache_hit=True, progress=1.0,
                      exit_code=0, started_at=now, finished_at=now):  # fmt: skip
        share_artifacts(origin, follower)


def _hand_over(origin: Job, followers: list[Job]) -> None:
    """The origin was cancelled: its oldest follower runs instead, the others follow it."""
    heir, rest = followers[0], followers[1:]
    CachedJob.objects.filter(job=heir).update(role=CacheRole.ORIGIN, source=None)
    CachedJob.objects.filter(job__in=rest).update(source=heir)
    reason = f"took over from cancelled identical job {origin.pk}"
    Job.objects.filter(pk=heir.pk, state=JobState.QUEUED).update(reason=reason)
    record_event(heir, actor=ACTOR, reason=reason, kind="cache")
    for follower in rest:
        Job.objects.filter(pk=follower.pk, state=JobState.QUEUED).update(
            reason=follower_reason(follower, heir.pk)
        )
    trigger_dispatch()
