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

Races (docs/reliability.md, "Concurrency"): one key has at most one active origin, held by the
partial unique index on CachedJob (`active`), whoever inserts it. A submit decides its job's
role under its tenant's row lock and, before it locks the tenant's count row, holds the origin
it joins or is served from (`_hold`: PostgreSQL's FOR SHARE, to its commit): an origin ending
meanwhile either ends first, and the submit reads its end and looks again, or waits for the
submit's commit, and its end then settles the new follower too. The origin's end locks its
followers before it settles them, so a follower cancelled at the same moment is read cancelled.
The dispatcher reads the followers after the queue (apps/admission/quotas.py): a job is a
follower from its insert's commit, never later, so every follower it sees queued is known.
"""

from __future__ import annotations

import hashlib
import json
from datetime import timedelta

from django.conf import settings
from django.db import IntegrityError, connection, transaction
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
    """The key's active origin (the unique index's one row), if its job is still active. One
    whose job ended without saying so (no JobEnded: a raw update) is closed here, so that it
    never blocks the next origin."""
    link = (
        CachedJob.objects.filter(tenant=tenant, key=key, role=CacheRole.ORIGIN, active=True)
        .select_related("job")
        .first()
    )
    if link is None:
        return None
    if link.job.state not in JOB_ACTIVE:
        CachedJob.objects.filter(pk=link.pk).update(active=False)
        return None
    return link.job


LOOKS = 3  # an origin ending while a submit waits for its lock: the submit looks again


def place(tenant: Tenant, key: str, template) -> tuple[str, Job | None]:
    """The role a new job with this key takes, and the origin it joins or is served from (held
    to the commit, `_hold`): (HIT, a fresh succeeded origin), (FOLLOWER, the active origin), or
    (ORIGIN, None). Runs under the tenant's row lock, before the count row's."""
    for _ in range(LOOKS):
        fresh = fresh_origin(tenant, key, template)
        if fresh is not None:
            if _hold(fresh) == JobState.SUCCEEDED:
                return CacheRole.HIT, fresh
            continue  # requeued meanwhile
        leader = active_origin(tenant, key)
        if leader is None:
            return CacheRole.ORIGIN, None
        if _hold(leader) in JOB_ACTIVE:
            return CacheRole.FOLLOWER, leader
    # Still changing: start an origin; if another is active by now the unique index refuses
    # this one, and the submit's transaction runs again (apps/platform/retry.py).
    return CacheRole.ORIGIN, None


def _hold(origin: Job) -> str | None:
    """Lock the origin's row against changes until this transaction ends (PostgreSQL: FOR
    SHARE, which waits for a change in flight and blocks the next; the dispatcher skips a row
    held so) and return its state as committed now; None if it is gone. Taken before the
    tenant's count row: whoever ends the origin locks it first and takes that row after.
    SQLite runs one writer at a time: the state read is the state."""
    if not connection.features.has_select_for_update:
        return Job.objects.filter(pk=origin.pk).values_list("state", flat=True).first()
    table, pk = Job._meta.db_table, Job._meta.pk
    quote = connection.ops.quote_name
    with connection.cursor() as cursor:
        cursor.execute(
            f"SELECT {quote(Job._meta.get_field('state').column)} FROM {quote(table)} "
            f"WHERE {quote(pk.column)} = %s FOR SHARE",
            [pk.get_db_prep_value(origin.pk, connection)],
        )
        row = cursor.fetchone()
    return row[0] if row else None


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
    """The key's active origin: a concurrent one inserted first makes this raise IntegrityError
    (ONE_ACTIVE_ORIGIN), and the submit runs again to join it."""
    CachedJob.objects.create(job=job, tenant=tenant, key=key, role=CacheRole.ORIGIN, active=True)


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
    """Any job reached a terminal state (transition_job emits JobEnded): an origin is no longer
    active, and its followers are settled. They are locked first (in id order, as the reports
    lock jobs), each read again as it is then: one cancelled meanwhile is left out."""
    if not job.cacheable:
        return
    was_active = bool(
        CachedJob.objects.filter(job=job, role=CacheRole.ORIGIN, active=True).update(active=False)
    )
    waiting = Job.objects.filter(
        cache_link__source=job, cache_link__role=CacheRole.FOLLOWER, state=JobState.QUEUED
    )
    if connection.features.has_select_for_update:
        waiting = waiting.select_for_update(no_key=True, of=("self",))
    followers = sorted(waiting.order_by("pk"), key=lambda follower: follower.created_at)
    if not followers:
        return
    if job.state == JobState.SUCCEEDED:
        for follower in followers:
            _finish_follower_with(follower, job)
    elif job.state == JobState.CANCELLED:
        _hand_over(job, followers, was_active)
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


def _hand_over(origin: Job, followers: list[Job], was_active: bool) -> None:
    """The origin was cancelled: its oldest follower runs instead, the others follow it."""
    heir, rest = followers[0], followers[1:]
    # The cancelled origin was closed first (job_ended), so the heir is its key's one active
    # origin; unless the cancelled one was not active itself (a younger twin from before the
    # unique index): then the heir runs for the rest, and no new submit joins it.
    CachedJob.objects.filter(job=heir).update(role=CacheRole.ORIGIN, source=None, active=was_active)
    CachedJob.objects.filter(job__in=rest).update(source=heir)
    reason = f"took over from cancelled identical job {origin.pk}"
    Job.objects.filter(pk=heir.pk, state=JobState.QUEUED).update(reason=reason)
    record_event(heir, actor=ACTOR, reason=reason, kind="cache")
    for follower in rest:
        Job.objects.filter(pk=follower.pk, state=JobState.QUEUED).update(
            reason=follower_reason(follower, heir.pk)
        )
    trigger_dispatch()


def on_job_requeued(event: events.JobRequeued) -> None:
    """In-transaction handler of JobRequeued: an origin back in the queue (support staff's
    requeue) is the key's active origin again, unless another one is by now; then it runs on
    its own and nothing joins it."""
    job = event.job
    if not job.cacheable:
        return
    link = CachedJob.objects.filter(job=job, role=CacheRole.ORIGIN, active=False).first()
    if link is None or active_origin(link.tenant, link.key) is not None:
        return
    try:
        with transaction.atomic():  # a savepoint: a concurrent origin's insert may win
            CachedJob.objects.filter(pk=link.pk).update(active=True)
    except IntegrityError:
        pass
