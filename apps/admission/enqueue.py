"""A job into the queue: the tenant's row lock, what the tenant may submit, the queued-job cap
(the count the jobs table's triggers keep and the tenant's arrays' virtual tasks), and the job
with its audit event in the statements of
apps/admission/rows.py. The submit use case (apps/admission/submit.py) and the tests call it;
it lives here, above the jobs app, because the kept count and the fast inserts are admission's.
"""

from __future__ import annotations

from django.db import connection, transaction

from apps.admission import rows
from apps.jobs.models import Job, JobEvent
from apps.jobs.services import (
    JobSpec,
    check_allowed,
    new_job,
    queue_full,
    tenant_limits,
    trigger_dispatch,
)
from apps.tenants.models import Tenant


@transaction.atomic
def job_submit(*, tenant: Tenant, user, spec: JobSpec, limits: dict | None = None, locked: bool = False,
               dispatch: bool = True, built: tuple[Job, JobEvent, tuple] | None = None) -> Job:  # fmt: skip
    """Submit a job in a transaction of its own (see `enqueue_job`).

    `locked`: the caller holds the tenant's row lock already in this transaction and passes the
    tenant with its tier loaded (and its `limits`), so none of it is read twice; `dispatch=False`:
    the caller asks for the dispatch pass itself (apps/admission/dispatch.py coalesces them)."""
    if not locked:
        # Lock the tenant row so concurrent submits of one tenant count queued jobs one at a time.
        tenant = (
            Tenant.objects.select_for_update(no_key=True, of=("self",))
            .select_related("tier")
            .get(pk=tenant.pk)
        )
    job = enqueue_job(tenant=tenant, user=user, spec=spec, limits=limits, built=built)
    if dispatch:
        trigger_dispatch()
    return job


def enqueue_job(*, tenant: Tenant, user, spec: JobSpec, limits: dict | None = None,
                built: tuple[Job, JobEvent, tuple] | None = None) -> Job:  # fmt: skip
    """A submit's own steps, inside a transaction the caller holds with the tenant's row lock
    taken (job_submit's, or admission's: a savepoint of its own would be two more statements
    while the lock is held): what the tenant may submit, the queued-job cap, the job and its
    event. `built`: the job, its event and their insert parameters, made before the lock
    (new_job, rows.insert_params), so that the lock is held for the statements alone."""
    check_allowed(tenant, spec)
    if limits is None:
        limits = tenant_limits(tenant)
    cap = limits["max_queued_jobs"]
    if connection.vendor != "postgresql":
        # SQLite: the transaction holds the one write lock; the cap's check (the kept count and
        # the arrays' virtual tasks) is in the job's insert, and the count is read again only
        # for a refusal's words.
        job, event, params = built or (*new_job(tenant=tenant, user=user, spec=spec), None)
        saved = rows.insert_if_room(job, event, params, cap=cap)
        if saved is None:
            raise queue_full(tenant, rows.queued_for_cap(tenant), limits)
        return saved
    # The count the jobs table's triggers keep (apps/admission/queued.py) and the tenant's arrays'
    # virtual tasks; on PostgreSQL the count's row is locked first, so a submit that checks the
    # cap without the tenant's lock waits for this one.
    queued = rows.queued_for_cap(tenant)
    if queued >= cap:
        raise queue_full(tenant, queued, limits)
    job, event, params = built or (*new_job(tenant=tenant, user=user, spec=spec), None)
    job, _ = rows.insert_job_and_event(job, event, params)
    return job
