"""Admission of one submission (the steps behind apps/admission/submit.py's `submit_job`), in order:

1. an idempotent replay (same tenant, key and body within 24 h) answers with its job: no token
   spent, nothing created; another body with that key is 409;
2. the rate limits take a token (429 with Retry-After, or the Redis-down fail mode);
3. (the caller validates the body into a JobSpec)
4. under the tenant's row lock: the key again, the parents and the job's place in the result
   cache (a hit ends at once, a follower waits on its identical origin), the GPU-hour quota
   (403), then the job, through `enqueue_job` (tier, commands, queued-job cap). On PostgreSQL a
   submit with no key and no cached template (the usual one) does all of step 4 in one round
   trip instead (`_admit_in_one_statement`).

Step 4's row locks come in one order (docs/reliability.md, "Concurrency"): the tenant's row,
then the existing jobs the new rows will name (the parents, the origin joined or served from),
then the tenant's count row, then the inserts. Whatever moves a job locks that job before its
move takes the count row (the jobs table's triggers), so no submit waits for a job while
holding the count row: at its commit, the foreign-key checks on those jobs find them held by
this transaction already. A transaction PostgreSQL still aborts (a deadlock it broke, the
active origin's unique index won by another submit) runs again whole (`retried`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from django.db import IntegrityError, connection, transaction
from django.utils import timezone

from apps.admission import cache, dispatch, idempotency, quotas, rows, submitters
from apps.admission.enqueue import enqueue_job
from apps.admission.models import ONE_ACTIVE_ORIGIN, CacheRole
from apps.admission.ratelimit import RateDecision, check_submit
from apps.admission.writer import end_turn_at_commit, write_turn
from apps.jobs import dependencies
from apps.jobs import services as jobs
from apps.jobs.models import Job, JobState
from apps.jobs.services import JobSpec, tenant_limits, transition_job
from apps.platform.retry import retried_on
from apps.tenants.models import Membership, Quota, Tenant


def submitter(user, *, template: str | None = None, sku: str | None = None) -> Membership | None:
    """The user's membership with its tenant, tier and quota: one statement for all a submit
    needs to know about who is asking (the lazy accessors would take four), which also reads
    the template and SKU of these names for the validation (rows.membership_of). Where the body
    names neither, no statement if this process has kept the membership (submitters.py)."""
    if template is None and sku is None:
        kept = submitters.CACHE.get(user)
        if kept is not None:
            return kept
    epoch = submitters.CACHE.epoch
    membership = rows.membership_of(user, template=template, sku=sku)
    if membership is not None:
        membership.user = user
    submitters.CACHE.put(user, membership, epoch=epoch)
    return membership


def limits_of(tenant: Tenant) -> dict:
    """The tenant's effective limits, from its quota row when it came with the tenant."""
    try:
        quota = tenant.quota if Tenant.quota.is_cached(tenant) else None
    except Quota.DoesNotExist:
        quota = None
    if quota is None:
        return tenant_limits(tenant)  # creates the row the first time
    quota.tenant = tenant
    return quota.effective()


@dataclass
class Admission:
    tenant: Tenant
    user: object
    key: str | None
    digest: str
    limits: dict
    rate: RateDecision | None = None
    job: Job | None = None
    created: bool = False
    headers: dict[str, str] = field(default_factory=dict)

    @classmethod
    def start(cls, *, tenant: Tenant, user, body, idempotency_key: str | None) -> Admission:
        """Steps 1 and 2. Never raises for the rate limit: the caller first takes `headers`
        (they go on every answer), then calls `raise_if_refused`."""
        key = idempotency.clean_key(idempotency_key)
        digest = (
            idempotency.body_digest(body) if key is not None else ""
        )  # only a key is compared with it
        admission = cls(tenant=tenant, user=user, key=key, digest=digest, limits=limits_of(tenant))
        admission.job = idempotency.replay(
            tenant=tenant, key=admission.key, digest=admission.digest
        )
        if admission.job is None:
            admission.rate = check_submit(tenant=tenant, user=user, limits=admission.limits)
            admission.headers = dict(admission.rate.headers)
        return admission

    @property
    def replayed(self) -> bool:
        return self.job is not None and not self.created

    def raise_if_refused(self) -> None:
        if self.rate is not None:
            self.rate.raise_if_refused()

    def submit(self, spec: JobSpec, *, depends_on: list[dependencies.Wanted] | tuple = ()) -> Job:
        """Step 4. A concurrent request that recorded the same key first wins; this one then
        answers as its replay. `depends_on`: the body's, validated (docs/pipelines.md): the job
        is inserted held, its parents are read under their locks in `_admit`."""
        job, event = jobs.new_job(
            tenant=self.tenant, user=self.user, spec=spec
        )  # made before any lock
        if depends_on:
            dependencies.hold_at_submit(job, list(depends_on))
        if (
            self.key is None
            and not depends_on
            and _in_one_statement()
            and not cache.cache_key(spec, self.tenant)
        ):
            saved = _admit_in_one_statement(
                tenant=self.tenant, spec=spec, limits=self.limits, job=job, event=event
            )
            if saved is not None:
                self.job, self.created = saved, True
                return saved
        built = (
            job,
            event,
            rows.insert_params(job, event),
        )  # so that the lock covers the statements alone
        try:
            with (
                write_turn() as turn
            ):  # SQLite: submissions queue for its one write lock (writer.py)
                self.job, self.created = _admit(tenant=self.tenant, user=self.user, spec=spec, key=self.key,
                                                digest=self.digest, limits=self.limits, turn=turn, built=built,
                                                depends_on=list(depends_on))  # fmt: skip
        except IntegrityError:
            self.job = idempotency.replay(tenant=self.tenant, key=self.key, digest=self.digest)
            if self.job is None:
                raise
        return self.job


def _in_one_statement() -> bool:
    return connection.vendor == "postgresql" and not connection.in_atomic_block


def _admit_in_one_statement(
    *, tenant: Tenant, spec: JobSpec, limits: dict, job: Job, event
) -> Job | None:
    """The usual submit on PostgreSQL (no Idempotency-Key, a template that is not cached) in
    one round trip, committed on its own (rows.admit): the tenant's count row locked, then the
    cap's check on its queue (its kept count and its arrays' virtual tasks) and the job and its
    event. The transaction of `_admit` takes five (BEGIN, the tenant's lock, the count, the
    insert, COMMIT), all while holding the lock. Returns the job as saved; None: nothing
    written, the tenant has no count row yet (its first job), and `_admit` takes it from here."""
    quotas.check_gpu_hours(tenant=tenant, limits=limits, gpus_wanted=spec.gpus * spec.nodes)
    jobs.check_allowed(tenant, spec)
    admitted = rows.admit(job, event, cap=limits["max_queued_jobs"])
    if admitted is None:
        return None
    queued, saved = admitted
    if saved is None:
        raise jobs.queue_full(tenant, queued, limits)
    dispatch.request_soon()
    return saved


@retried_on(ONE_ACTIVE_ORIGIN)
@transaction.atomic
def _admit(*, tenant: Tenant, user, spec: JobSpec, key: str | None, digest: str,
           limits: dict, turn=None, built: tuple | None = None,
           depends_on: list[dependencies.Wanted] | None = None) -> tuple[Job, bool]:  # fmt: skip
    end_turn_at_commit(turn)  # first of the commit hooks: before the dispatch request
    # The tenant's row lock serializes this tenant's submissions, so the key, the cache lookups
    # and the queued-job count all see each other's writes. PostgreSQL: SELECT ... FOR NO KEY UPDATE.
    # SQLite has no row locks: the transaction's BEGIN IMMEDIATE already holds the database's
    # one write lock, so nothing more is taken (or read) there. The tenant and its limits were
    # read with the membership just before; enqueue_job runs under the lock.
    if connection.features.has_select_for_update:
        rows.lock_tenant(tenant)
    earlier = idempotency.replay(tenant=tenant, key=key, digest=digest)
    if earlier is not None:
        return earlier, False  # recorded meanwhile by a request we waited for
    # The existing jobs the new rows name, locked before the queued count's row is (the job's
    # insert takes it): the parents (404 for another tenant's), and the origin this job joins
    # or is served from. One that ends meanwhile waits for this submit, or was read ended.
    parents = dependencies.resolve(tenant, depends_on) if depends_on else []
    # A job with dependencies runs after them, never from the result cache or with a twin.
    cache_key = None if depends_on else cache.cache_key(spec, tenant)
    role, origin = cache.place(tenant, cache_key, spec.template) if cache_key else (None, None)
    if role != CacheRole.HIT:
        quotas.check_gpu_hours(tenant=tenant, limits=limits, gpus_wanted=spec.gpus * spec.nodes)
    # A submit's own steps in this transaction (job_submit's would add a savepoint: two more
    # statements while the lock is held).
    job = enqueue_job(tenant=tenant, user=user, spec=spec, limits=limits, built=built)
    if parents:
        dependencies.attach(job, parents)  # decides those whose parents have ended already
    dispatch.after_commit()  # after the turn's hook: the turn ends before the request is sent
    if cache_key:
        _link(job, tenant=tenant, key=cache_key, role=role, origin=origin)
    idempotency.remember(tenant=tenant, key=key, digest=digest, job=job)
    return job, True


def _link(job: Job, *, tenant: Tenant, key: str, role, origin: Job | None) -> None:
    """The job's place in the result cache, as `cache.place` decided it."""
    if role == CacheRole.HIT:
        assert origin is not None  # a hit is served from an origin
        _serve_from_cache(job, origin)
        cache.link_hit(job, tenant=tenant, key=key, origin=origin)
    elif role == CacheRole.FOLLOWER:
        assert origin is not None  # a follower joins one
        cache.link_follower(job, tenant=tenant, key=key, origin=origin)
    else:
        cache.link_origin(job, tenant=tenant, key=key)


def _serve_from_cache(job: Job, origin: Job) -> None:
    now = timezone.now()
    transition_job(job, to=JobState.SUCCEEDED, expect=[JobState.QUEUED], actor=cache.ACTOR,
                   reason=f"served from cache: result of job {origin.pk}", cache_hit=True, progress=1.0,
                   exit_code=0, started_at=now, finished_at=now)  # fmt: skip
    cache.share_artifacts(origin, job)
