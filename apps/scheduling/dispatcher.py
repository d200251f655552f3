"""The dispatcher: load the cluster, the running jobs and the queue from the database, ask the
pure policy (apps.scheduling.core.policy.decide) what to do, and apply each decision as a
guarded update (see apps.jobs.services.jobs_place and job_preempt).

The cluster is read once and kept between passes, brought up to date from the database each
pass (apps/scheduling/kept.py); the queue is read fresh. The database is the truth: two
dispatchers running at once, or a kept state behind it, can at worst both try the same placement,
which the job's guarded update and the GPU allocation index refuse to the second.
"""

from __future__ import annotations

import contextlib
import logging
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, cast

from django.conf import settings
from django.db import connection, transaction
from django.db.models import Count, Q
from django.utils import timezone

from apps.admission.arrays import materialise as materialise_arrays
from apps.admission.quotas import DispatchGate
from apps.jobs import queue_order as queue_order_of
from apps.jobs.models import (
    AttemptMember,
    GpuAllocation,
    Job,
    JobAttempt,
    JobState,
    JobTemplate,
)
from apps.jobs.services import JobPlacement, MemberPlacement, job_preempt, jobs_place
from apps.nodes.models import Gpu, GpuHealth, GpuSku, Node, NodeState
from apps.platform.db import prepared_cursor
from apps.platform.errors import ServiceError
from apps.platform.retry import retried
from apps.scheduling import core, kept, plan, publish, reads
from apps.scheduling.core import policy, waiting
from apps.scheduling.kept import (
    FENCED_LABEL,
    HELD,
    ClusterSnapshot,
    epoch,
    selector_of,
    tolerations_of,
)
from apps.scheduling.models import ProvisionRequest, ProvisionState
from apps.scheduling.redis import client
from apps.tenants.models import Tenant, Tier

log = logging.getLogger(__name__)
# Per tier/tenant/pool queue, the jobs handed to the policy per pass: its backfill window
# (`PolicyConfig.backfill_depth`), so a pass sees every job it could look at, whatever the
# queue's length, and no more.
QUEUE_HEADS = policy.PolicyConfig().backfill_depth
REASON_BATCH = 500  # reasons written per UPDATE
SQLITE_WRITE_CHUNK = 8  # decisions applied per transaction on SQLite (one writer at a time)
RESERVATION_KEY = "gpuplatform:dispatch:reservation"
# While passes place jobs (a drain), each pass's inputs change, and the start plan would be made
# at its own limit (plan.MIN_SECONDS), a sixth of a draining dispatcher's CPU: after a pass that
# placed, it is made at most this often. The placed jobs' estimates are not needed any more,
# and the rest keep their last ones a little longer.
PLAN_WHILE_PLACING_S = 5.0


class _LastPass:
    placed = False  # the previous pass placed a job


@dataclass
class DispatchResult:
    placed: list[str] = field(default_factory=list)
    preempted: list[str] = field(default_factory=list)
    waiting: int = 0
    seconds: float = 0.0
    free_gpus: int = 0  # at the pass's start (healthy, on ready nodes, not held)

    @property
    def futile(self) -> bool:
        """Nothing placed or preempted, and no GPU free: until a job ends or a node comes, a
        pass for a new submit can only find the same (apps/scheduling/tasks.py waits a little)."""
        return not self.placed and not self.preempted and self.free_gpus == 0


def placement_strategy(jobs) -> core.Strategy | str:
    """The default fgd-plus places to keep free capacity useful for the request mix it expects.
    A manager built for one pass cannot learn that mix, so it is given the queue's; with an
    empty queue there is nothing to place and any will do (one of the same kind: the kept
    cluster is indexed for it)."""
    pods = [core.Pod(name=str(job.pk), gpus=job.gpus, nodes=job.nodes) for job in jobs]
    return core.FGDPlus(workload=core.Workload.from_pods(pods)) if pods else core.FGDPlus()


def cluster_state(strategy: core.Strategy | str, tiers: list[Tier] | None = None) -> kept.State:
    """The pass's cluster: the kept state, brought up to date (apps/scheduling/kept.py), its
    stamp of the tiers' graces taken from the pass's `tiers` rows (read once per pass)."""
    return kept.KEPT.pass_state(strategy, tiers)


def _tolerations(job: Job) -> tuple[str, ...]:
    """The queued job's tolerations, by the running jobs' rule (kept.tolerations_of)."""
    return tolerations_of(job.command, job.tenant.allow_commands)


def _wait_reason(job: Job, reason: str, snapshot: ClusterSnapshot) -> str:
    """The policy's reason, and for a job in an image that no node could take, why: an image
    runs only on a node that fences its jobs (docs/images.md), and none here does."""
    if not job.image or not reason.startswith("needs "):
        return reason
    if any(FENCED_LABEL in node.labels for node in snapshot.cluster.list_nodes()):
        return reason
    return (f"{reason}: a job in an image runs only on a node that fences its jobs "
            "(its agent root, with cgroups), and no node here does")  # fmt: skip


def tier_rows() -> list[Tier]:
    """The tiers, read once per pass: the policy's tiers, the preemption grace, the heads' tiers
    and the kept cluster's stamp of the graces all come from these rows (each read its own, four
    reads of one small table a pass). Written once (apps/scheduling/reads.py)."""
    return reads.tier_rows()


def tier_policies(rows: list[Tier] | None = None) -> dict[str, policy.TierPolicy]:
    return {
        tier.name: policy.TierPolicy(
            name=tier.name,
            level=tier.level,
            weight=float(tier.weight),
            preemptible=tier.preemptible,
            can_preempt=tier.can_preempt,
            guaranteed_share=tier.guaranteed_share,
            borrowing_limit=tier.borrowing_limit,
            age_limit_s=float(tier.age_limit_seconds),
            min_runtime_s=float(tier.min_runtime_seconds),
            max_preemptions=tier.max_preemptions,
            preempt_wait_s=float(tier.preempt_wait_seconds),
        )  # fmt: skip
        for tier in (tier_rows() if rows is None else rows)
    }


def policy_config(rows: list[Tier] | None, window: int | None = None) -> policy.PolicyConfig:
    """The pass's config: the grace from the tier `rows` (read here when None), the window
    (`pass_window`, counted here when None)."""
    rows = tier_rows() if rows is None else rows
    grace = max((t.preemption_grace_seconds for t in rows), default=30)
    grace_s = float(grace + settings.KILL_GRACE_SECONDS)
    depth = pass_window() if window is None else window
    if settings.SCHEDULING_POLICY == "fair-reclaim":  # `fair` plus fair share inside each tier
        return policy.PolicyConfig(grace_s=grace_s, backfill_depth=depth, **policy.FAIR_RECLAIM)
    return policy.PolicyConfig(
        ordering=settings.SCHEDULING_POLICY, grace_s=grace_s, backfill_depth=depth
    )


def pass_window(state: kept.State | None = None) -> int:
    """Jobs a pass hands the policy per queue and lets it look at per pool: the backfill window
    (QUEUE_HEADS) plus one per GPU free now, since each start takes at least one. A full cluster
    looks at the window as before; an idle one starts all it can in one pass, not a window's
    worth per pass (filling 8,000 free GPUs took 32 passes). A GPU held on a node that is not
    ready counts against the free ones (a smaller window: the next pass goes on).

    A pass takes the free count from its kept cluster `state` (`State.free_gpus`: the same
    figure, from the rows and stamps it was just checked against); without one, two counts."""
    if state is not None:
        return QUEUE_HEADS + state.free_gpus()
    usable = Gpu.objects.filter(health=GpuHealth.HEALTHY, node__state=NodeState.READY).count()
    held = GpuAllocation.objects.filter(released_at=None).count()
    return QUEUE_HEADS + max(0, usable - held)


def arriving_nodes() -> list[policy.ArrivingNode]:
    """Nodes the autoscaler asked for that have not registered yet (preemption may wait). Most
    passes find no request open (none at all without autoscaling): a probe written once says
    so, where the ORM built its read anew every pass (0.6-0.9 ms of a small pass's CPU)."""
    states = [ProvisionState.PENDING, ProvisionState.RUNNING]
    with prepared_cursor() as cursor:
        cursor.execute(
            f"SELECT 1 FROM {ProvisionRequest._meta.db_table} WHERE state IN (%s, %s) LIMIT 1",
            [state.value for state in states],
        )
        if cursor.fetchone() is None:
            return []
    registered = Node.objects.values("name")
    pending = ProvisionRequest.objects.filter(state__in=states).exclude(node_name__in=registered)
    return [
        policy.ArrivingNode(ready_at=epoch(r.ready_at), gpu_model=r.sku.name, gpus=r.gpus)
        for r in pending.select_related("sku")
    ]


def ordered_queue(heads: int = QUEUE_HEADS, tiers: dict[int, Tier] | None = None,
                  kept_heads: dict | None = None, head_rows: list[tuple] | None = None):  # fmt: skip
    """The heads of the queue: per (tier, tenant, pool) queue its first `heads` jobs by submit
    time (the policy's order inside such a queue), plus every job with a priority boost (its
    submit counts as earlier). A pool is what decides where a job may go: SKU, node selector,
    and whether it runs a command (tolerations). Every queued job is visible once it reaches
    the head of its queue, however long the queue: no oldest-N cut.

    Less the retries still waiting out their backoff (their reason says until when) and the jobs
    whose previous attempt still has a process stopping (a lost gang's survivors): a job never
    runs twice at once, and the jobs held by their dependencies (apps/jobs/dependencies.py;
    released with a dispatch).

    On PostgreSQL the heads are read through the queue's own index (`_heads_through_index`), in
    time that grows with the number of queues, not of queued jobs; elsewhere by numbering the
    queued rows in a window (`_numbered_heads`). Both give the same jobs.

    `tiers` (by id), when the caller has read them: the jobs' tiers are set from them, not read
    again, and a job of a tier not among them is left out (the pass has no policy for it).

    `kept_heads` (by id), the heads the last pass of the same kept state got: the heads' ids
    come with what may change on a queued job without its version (its reason, priority boost,
    hold), and only the rows that are new or changed are read and built whole (in a drain of
    1,000 jobs, 256 heads built again each pass, 7.6 ms of CPU a pass on SQLite, to place one to
    five). Their tenants, SKUs and templates are read afresh every pass either way. `head_rows`:
    those ids and fields as the pass read them already (`_head_rows`, for `_Idle`)."""
    source, params = _heads_source(heads)
    table, quote = connection.ops.quote_name(Job._meta.db_table), connection.ops.quote_name
    # Raw SQL, as the heads' ids are: the ORM built this statement anew every pass, 3.5 ms of
    # CPU of a 17 ms pass that places one job (its window and subqueries), for 0.3 ms of reading.
    columns = ", ".join(f"{table}.{quote(f.column)}" for f in Job._meta.concrete_fields)
    kept_heads = kept_heads or {}
    if any(job.state == JobState.QUEUED for job in kept_heads.values()):
        jobs = _heads_kept_or_read(kept_heads, source, params, head_rows)
    else:  # nothing kept that could serve (none given, or the last pass placed all it had)
        jobs = list(Job.objects.raw(f"SELECT {columns} FROM {source}", params))
    if tiers is not None:
        jobs = [job for job in jobs if job.tier_id in tiers]
        for job in jobs:
            job.tier = tiers[job.tier_id]
    # Read by id, not joined: the heads share a few tiers, tenants, SKUs and templates, and a
    # join built them again for every job (for 1,000 heads 4,000 model instances and 2,000 of the
    # templates' JSON decoded; a steady pass's CPU 0.25 s, against 0.18 s with four small reads).
    # Set on every head, kept ones too: a tenant's settings (allow_commands) may have changed.
    # Written once (apps/scheduling/reads.py), as the ORM's `in_bulk` read them.
    related: list[tuple[str, Any]] = [("tenant", Tenant), ("gpu_sku", GpuSku),
                                      ("template", JobTemplate)]  # fmt: skip
    for name, model in related if tiers is not None else [("tier", Tier), *related]:
        keys = {getattr(job, f"{name}_id") for job in jobs} - {None}
        rows = _rows_by_id(model, keys) if keys else {}
        for job in jobs:
            row = rows.get(getattr(job, f"{name}_id"))
            if row is not None:
                setattr(job, name, row)
    return jobs


def _heads_source(heads: int) -> tuple[str, list]:
    """`FROM ...` of the heads' rows in submit order (without the FROM), and its parameters."""
    now = connection.ops.adapt_datetimefield_value(timezone.now())
    quote = connection.ops.quote_name
    table = quote(Job._meta.db_table)
    if connection.vendor == "postgresql":
        # `= ANY(ARRAY(...))`: the ids are read first and the rows then fetched by primary key
        # (`IN (...)` was planned as a hash join over a scan of the whole jobs table).
        ids, params = _heads_through_index(heads, now)
        picked = f"{table}.{quote('id')} = ANY(ARRAY({ids}))"
    else:
        ids, params = _numbered_heads(heads, now)
        picked = f"{table}.{quote('id')} IN ({ids})"
    return f"{table} WHERE {picked} ORDER BY {table}.{quote('created_at')}", params


def _rows_by_id(model, keys) -> dict:
    if model is Tier:  # only where the caller read no tiers (never in a pass)
        return Tier.objects.in_bulk(keys)
    return reads.rows_by_id(model, keys)


# What may change on a queued job's row without its version: the heads' read compares these.
_UNVERSIONED = ("version", "state", "reason", "priority_boost", "held_by_dependencies")


def _head_rows(source: str, params: list) -> list[tuple]:
    """(id, the `_UNVERSIONED` fields) of the heads in `source`, in its order."""
    table = connection.ops.quote_name(Job._meta.db_table)
    pk = Job._meta.pk
    assert pk is not None
    names = ", ".join(f"{table}.{connection.ops.quote_name(name)}" for name in _UNVERSIONED)
    with prepared_cursor() as cursor:  # the same text every pass: prepared on PostgreSQL
        cursor.execute(
            f"SELECT {table}.{connection.ops.quote_name('id')}, {names} FROM {source}", params
        )
        return [(pk.to_python(row[0]), tuple(row[1:])) for row in cursor.fetchall()]


def _heads_kept_or_read(kept_heads: dict, source: str, params: list,
                        rows: list[tuple] | None = None) -> list:  # fmt: skip
    """The heads in `source`'s order: the kept instance where its row's `_UNVERSIONED` fields are
    as kept, else the row read whole (one statement for all of those). `rows`: `_head_rows` of
    `source` when read already."""
    rows = _head_rows(source, params) if rows is None else rows
    jobs: list = []
    missing = []
    for job_id, values in rows:
        job = kept_heads.get(job_id)
        # As read: SQLite's 0 / 1 for a boolean compares equal to False / True.
        if job is not None and tuple(getattr(job, name) for name in _UNVERSIONED) == values:
            jobs.append(job)
        else:
            jobs.append(job_id)
            missing.append(job_id)
    if missing:
        read = reads.jobs_by_id(missing)  # written once, prepared on PostgreSQL
        # A row that left the queue between the two reads is left out (as a read a moment later).
        jobs = [read.get(job) if not isinstance(job, Job) else job for job in jobs]
        jobs = [job for job in jobs if job is not None and job.state == JobState.QUEUED]
    return jobs


def _may_start(now) -> tuple[str, list]:
    """SQL on a queued job `j` (and its parameters): it may start now, not held by its
    dependencies, past its retry backoff, and no process of an earlier attempt still stopping."""
    member, attempt = AttemptMember._meta.db_table, JobAttempt._meta.db_table
    return (
        "NOT j.held_by_dependencies AND (j.not_before IS NULL OR j.not_before <= %s) "
        f"AND NOT EXISTS (SELECT 1 FROM {member} m JOIN {attempt} a ON a.id = m.attempt_id "
        "WHERE a.job_id = j.id AND m.ended_at IS NULL)"
    ), [now]


# The state in SQL: a literal, which proves the partial indexes' predicate on PostgreSQL.
_QUEUED = f"j.state = '{JobState.QUEUED.value}'"


def _numbered_heads(heads: int, now) -> tuple[str, list]:
    """The ids of the heads as a window numbers them (every queued row sorted by its queue and
    submit), and the parameters: SQLite's read (no LATERAL), and the reference
    `_heads_through_index` is checked against. Numbered over narrow rows (the key and the
    partition), then the heads' rows fetched: the window sorts every queued row, so it carries
    no more of them than it needs. `now` as the database takes it (adapt_datetimefield_value)."""
    may_start, params = _may_start(now)
    sql = (
        "SELECT n.id FROM (SELECT j.id, j.priority_boost, ROW_NUMBER() OVER (PARTITION BY "
        "j.tier_id, j.tenant_id, j.gpu_sku_id, j.node_selector, (j.command IS NOT NULL) "
        f"ORDER BY j.created_at, j.id) AS head FROM {Job._meta.db_table} j "
        f"WHERE {_QUEUED} AND {may_start}) n WHERE n.head <= %s OR n.priority_boost <> 0"
    )
    return sql, [*params, heads]


def _heads_through_index(heads: int, now) -> tuple[str, list]:
    """PostgreSQL: the ids of the heads (as `_numbered_heads`'s), and the parameters, through
    the partial index on (queue, submit) of queued jobs (jobs migration 0013). The queues' keys
    are found by skipping through the index from one key to the next (a recursive CTE, one
    probe per queue), and each queue's first `heads` jobs that may start are read from its
    range of the index in order (LATERAL ... LIMIT): a few milliseconds at 50,000 queued, where
    the window sorted them all (0.2-0.26 s, docs/scheduling.md). A missing SKU is keyed as 0,
    which no row's id is; a node selector by the MD5 of its (canonical) text, since a selector
    can be larger than an index entry may be. Jobs with a priority boost come from their own
    small index."""
    job, queued = Job._meta.db_table, _QUEUED
    # A queue's key, part by part, as the index has it (on `j`, the jobs table).
    parts = {"tier_id": "j.tier_id", "tenant_id": "j.tenant_id", "sku": "COALESCE(j.gpu_sku_id, 0)",
             "selector": "md5(j.node_selector::text)", "runs": "(j.command IS NOT NULL)"}  # fmt: skip
    key, names = ", ".join(parts.values()), ", ".join(parts)
    after = f"({key}) > ({', '.join(f'q.{name}' for name in parts)})"
    same_queue = " AND ".join(f"{part} = q.{name}" for name, part in parts.items())
    may_start, _ = _may_start(now)
    sql = (
        f"WITH RECURSIVE queues ({names}) AS ("
        f"(SELECT {key} FROM {job} j WHERE {queued} ORDER BY {key} LIMIT 1) "
        f"UNION ALL SELECT n.* FROM queues q CROSS JOIN LATERAL ("
        f"SELECT {key} FROM {job} j WHERE {queued} AND {after} ORDER BY {key} LIMIT 1) n) "
        f"SELECT h.id FROM queues q CROSS JOIN LATERAL ("
        f"SELECT j.id FROM {job} j WHERE {queued} AND {same_queue} AND {may_start} "
        f"ORDER BY j.created_at, j.id LIMIT %s) h "
        f"UNION SELECT j.id FROM {job} j WHERE {queued} AND j.priority_boost <> 0 AND {may_start}"
    )  # fmt: skip
    return sql, [now, heads, now]


def queued_job(job: Job) -> policy.QueuedJob:
    return policy.QueuedJob(
        job_id=str(job.pk), tenant=job.tenant.slug, tier=job.tier.name, gpus=job.gpus, nodes=job.nodes,
        submit=epoch(job.created_at) - job.priority_boost * settings.PRIORITY_BOOST_SECONDS,
        est_runtime_s=float(job.max_runtime_seconds),
        gpu_models=(job.gpu_sku.name,) if job.gpu_sku_id and job.gpu_sku else (), node_selector=selector_of(job.node_selector, job.image),
        preemptions=job.preemption_count, tolerations=_tolerations(job),
    )  # fmt: skip


@retried  # a deadlock PostgreSQL broke: the pass again, reading everything afresh
def dispatch_once() -> DispatchResult:
    started = time.monotonic()
    result = DispatchResult()
    now = timezone.now()
    rows = tier_rows()
    tiers = tier_policies(rows)
    # The kept cluster first: its free GPUs give the pass's window (no counts of its own). The
    # placement strategy's kind is all it needs; the queue's workload is set for the snapshot.
    state = cluster_state(core.FGDPlus(), rows)
    result.free_gpus = state.free_gpus()
    decisions: list[policy.Decision] = []
    try:
        config = policy_config(rows, window=pass_window(state))
        # Job arrays: rows for the tasks that could start (apps/admission/arrays.py).
        made = materialise_arrays()
        arriving = arriving_nodes()
        head_rows = None
        if not made and _IDLE.may_repeat(state, rows, arriving):
            head_rows = _head_rows(*_heads_source(config.backfill_depth))
            if _IDLE.same_heads(head_rows):
                kept.KEPT.done(state, decisions)
                _LastPass.placed = False
                result.seconds = time.monotonic() - started
                return result
        gate = (
            DispatchGate.load()
        )  # admission: per-tenant GPU caps, coalesced followers (apps/admission)
        queue = ordered_queue(heads=config.backfill_depth, tiers={tier.pk: tier for tier in rows},
                              kept_heads=state.heads, head_rows=head_rows)  # fmt: skip
        state.heads = {job.pk: job for job in queue}
        jobs = {str(job.pk): job for job in queue if not gate.hold(job)}
        snapshot = state.snapshot(placement_strategy(jobs.values()))
        _drop_moved(jobs, snapshot)
        held = _held_reservations(jobs)
        queued = [queued_job(job) for job in jobs.values()]
        usage = kept.KEPT.usage(state, now, config.half_life_s)
        facts = kept.job_facts(state)
        if _plan_wanted():
            _plan(lambda: plan.PLANNER.make(now, jobs, snapshot, queued, tiers, usage, config,
                                            held, arriving, facts, kept.KEPT.runs()))  # fmt: skip
        decisions = policy.decide(
            epoch(now), snapshot.cluster, queued, snapshot.running, tiers, usage, config=config,
            held_reservation=held, arriving=arriving,
        )  # fmt: skip
        _apply(list(decisions), jobs, gate, snapshot, result, held)
        _IDLE.saw(state, rows, arriving, queue, result)
    except BaseException:
        _IDLE.forget()
        kept.KEPT.failed(state)
        raise
    kept.KEPT.done(state, decisions)
    _LastPass.placed = bool(result.placed)
    result.seconds = time.monotonic() - started
    if result.placed or result.preempted:
        log.info("dispatch: placed %d, preempted %d, %d waiting, %.3fs", len(result.placed), len(result.preempted),
                 result.waiting, result.seconds)  # fmt: skip
    return result


# A full pass over a cluster that can take no work this often at least, however little changed:
# what enters its heads' reasons besides the heads, the tiers and the cluster (a tenant's GPU cap,
# an array's throttle, a tenant's or SKU's row, a node's state between lost and terminated) shows
# within this.
IDLE_FULL_PASS_S = 5.0


class _Idle:
    """A pass that can change nothing ends after its first reads. While no GPU can take work (no
    healthy GPU on a ready node), none is held and no node is on its way, a pass can place,
    preempt and reserve nothing: all it does is word its heads' reasons (the policy's "needs ...",
    the start plan's "only a lost node could run it"), and those are what the last full pass wrote
    when the heads, the tiers and the cluster are as that pass saw them. Such a pass reads the
    tiers, the cluster's stamps, the arrays' and arriving nodes' probes and its heads' rows, and
    stops there; it skipped admission's reads (`DispatchGate.load`, the followers), the heads'
    tenants, SKUs and templates, the usage, the plan, the policy and the reasons. A burst of
    submits to a cluster whose nodes are all lost (bench.slurm_peer's submit phase) ran that pass
    over the same window of heads every QUIET_MS (apps/scheduling/tasks.py), ~20 ms of CPU each.

    One per process, as kept.KEPT: it keeps what the last full pass over such a cluster saw."""

    def __init__(self) -> None:
        self.seen: tuple | None = None  # `_seen` of the last full pass over such a cluster
        self.heads: list[tuple] = []  # its heads as it left them, as `_head_rows` reads them
        self.at = float("-inf")  # monotonic time of that pass

    def may_repeat(self, state: kept.State, tiers: list[Tier], arriving: list) -> bool:
        """Whether this pass may repeat the last full one (`saw`), if its heads are the same:
        everything else is as that pass saw, and it was less than IDLE_FULL_PASS_S ago."""
        if self.seen is None or time.monotonic() - self.at >= IDLE_FULL_PASS_S:
            return False
        return self._seen(state, tiers, arriving) == self.seen

    def same_heads(self, rows: list[tuple]) -> bool:
        """Whether the heads' rows (`_head_rows`) are as the last full pass left them."""
        return self.seen is not None and rows == self.heads

    def saw(self, state: kept.State, tiers: list[Tier], arriving: list, queue: list[Job],
            result: DispatchResult) -> None:  # fmt: skip
        """After a full pass: keep what it saw if the cluster could take no work (else nothing)."""
        seen = self._seen(state, tiers, arriving)
        if seen is None or result.placed or result.preempted:
            self.forget()
            return
        # The heads as the pass left them (the reasons it wrote), as `_head_rows` reads them.
        self.heads = [(job.pk, tuple(getattr(job, name) for name in _UNVERSIONED)) for job in queue]
        self.seen, self.at = seen, time.monotonic()

    def forget(self) -> None:
        self.seen = None

    @staticmethod
    def _seen(state: kept.State, tiers: list[Tier], arriving: list) -> tuple | None:
        """What the pass sees besides its heads, or None when the cluster could take work (or the
        state is not the kept one: a pass that found it in use reads its own)."""
        if state.usable or state.holdings or arriving or state is not kept.KEPT.current():
            return None
        assert state.stamp is not None
        stamp = state.stamp
        fields = [field.attname for field in Tier._meta.concrete_fields]
        rows = tuple(tuple(getattr(tier, name) for name in fields) for tier in tiers)
        return state, tuple(stamp.nodes), stamp.gpus, stamp.allocations, stamp.settings, rows


_IDLE = _Idle()


def _plan_wanted() -> bool:
    """Whether this pass asks for the start plan: always, unless the previous pass placed jobs
    and a plan was made less than PLAN_WHILE_PLACING_S ago."""
    since = time.monotonic() - plan.PLANNER.made_at
    return not _LastPass.placed or since >= PLAN_WHILE_PLACING_S


def _plan(step) -> None:
    """The start plan (apps/scheduling/plan.py) is an answer to users, never a reason for a pass
    to fail: an error in it is logged and the pass goes on."""
    try:
        step()
    except Exception:
        log.exception("the start plan failed; estimates keep their last values")


def _apply(decisions, jobs: dict[str, Job], gate: DispatchGate, snapshot: ClusterSnapshot,
           result: DispatchResult, held) -> None:  # fmt: skip
    """Apply a pass's decisions in few transactions (the starts placed together, each still
    guarded: one that loses a race changes nothing and the rest go on; each preemption its own
    savepoint), and
    after each commit send one start message per node for what it placed there
    (publish.batched). On PostgreSQL the whole pass's starts and preemptions are one
    transaction; SQLite has one writer at a time, so there it commits every SQLITE_WRITE_CHUNK
    decisions: agents' reports and submits wait at most that long for the write lock. Then the
    reasons that changed, in batches, and the pass's reservations."""
    waiting_for_victims: set[str] = set()
    reasons: dict[str, tuple[Job, str]] = {}
    reserved: list[str] = []
    size = SQLITE_WRITE_CHUNK if connection.vendor == "sqlite" else max(1, len(decisions))
    for start in range(0, len(decisions), size):
        _apply_chunk(decisions[start : start + size], jobs, gate, snapshot, result,
                     waiting_for_victims, reasons, reserved)  # fmt: skip
    _write_reasons(reasons)
    if reserved:
        _store_reservations(
            reserved + [j for j in held if j not in reserved and j not in result.placed]
        )


def _apply_chunk(decisions, jobs: dict[str, Job], gate: DispatchGate, snapshot: ClusterSnapshot,
                 result: DispatchResult, waiting_for_victims: set, reasons: dict,
                 reserved: list) -> None:  # fmt: skip
    """The chunk's starts are placed together at its end (jobs_place: a few statements for all
    of them). The gate counts each start as it is decided, so a tenant's cap holds across the
    chunk; a start that then loses a race stays counted for the rest of this pass only (the
    next pass counts again from the database).

    A chunk that preempts is one transaction around its preemptions and starts; one that only
    starts is jobs_place's own transaction (around it, the chunk's would make jobs_place's a
    savepoint: two more statements in every small pass, for nothing more)."""
    starts: list[tuple[JobPlacement, policy.Start]] = []
    preempts = any(isinstance(decision, policy.Preempt) for decision in decisions)
    with publish.batched(), transaction.atomic() if preempts else contextlib.nullcontext():
        for decision in decisions:
            job = jobs.get(getattr(decision, "job_id", "") or getattr(decision, "for_job_id", ""))
            if isinstance(decision, policy.Start) and job is not None:
                if not gate.hold(job, decision.placement):
                    gate.placed(job, decision.placement)
                    starts.append((_placement(job, decision, snapshot), decision))
            elif isinstance(decision, policy.Preempt):
                result.preempted += _apply_preempt(decision, job, reasons)
                waiting_for_victims.add(decision.for_job_id)
            elif isinstance(decision, policy.Reserve) and job is not None:
                reserved.append(decision.job_id)
                if decision.job_id not in waiting_for_victims:
                    _set_reason(reasons, job, _reservation_reason(decision))
                result.waiting += 1
            elif isinstance(decision, policy.Wait) and job is not None:
                _set_reason(reasons, job, _wait_reason(job, decision.reason, snapshot))
                result.waiting += 1
        if starts:
            # A start the allocation index refused: another dispatcher's, or the kept cluster
            # missed a change; either way it is read whole next pass.
            placed = jobs_place(
                [placement for placement, _ in starts], on_lost_race=lambda _: kept.KEPT.suspect()
            )
            result.placed += [d.job_id for p, d in starts if p.job.pk in placed]


def _drop_moved(jobs: dict[str, Job], snapshot: ClusterSnapshot) -> None:
    """The cluster and the queue are read one after the other: a job requeued in between (lost,
    preempted) shows in both. The policy must see it once; the next pass sees it queued."""
    for running in snapshot.running:
        jobs.pop(running.job_id, None)


def _placement(job: Job, decision: policy.Start, snapshot: ClusterSnapshot) -> JobPlacement:
    members = [
        MemberPlacement(
            node_id=snapshot.node_ids[a.node],
            gpu_ids=[snapshot.gpu_ids[(a.node, i)] for i in a.gpu_indices],
            gpu_indices=list(a.gpu_indices),
        )
        for a in decision.placement.assignments
    ]
    return JobPlacement(job=job, members=members, why=decision.reason)


def _apply_preempt(
    decision: policy.Preempt, for_job: Job | None, reasons: dict[str, tuple[Job, str]]
) -> list[str]:
    done = []
    for victim in Job.objects.filter(
        pk__in=[v for v in decision.victim_ids if not v.startswith(HELD)]
    ):
        try:
            job_preempt(
                job=victim,
                actor="system:dispatcher",
                reason=decision.reason,
                for_job_id=decision.for_job_id,
            )
            done.append(str(victim.pk))
        except ServiceError as error:
            log.info("could not preempt %s: %s", victim.pk, error.message)
    if for_job is not None:
        _set_reason(
            reasons,
            for_job,
            f"waiting for {len(done)} preempted job(s) to checkpoint and stop: {decision.reason}",
        )
    return done


def _reservation_reason(decision: policy.Reserve) -> str:
    """The reservation in words, from the decision's fields: the policy's clock (epoch seconds)
    shown as a UTC time to the minute. To the second, the text changed from one pass to the next
    with nothing else changed: a job placed ahead ends, in the pass that placed it, at the pass's
    clock plus its limit, and in the next pass (read back from its attempt's row) at the row's
    insert time plus its limit, some milliseconds later; each change is a write and an event."""
    nodes = ", ".join(decision.nodes[:4]) + (", ..." if len(decision.nodes) > 4 else "")
    held = f"first in line: {nodes} held for it from {_utc(decision.at)} at the latest"
    if not decision.shortage:  # decided without `explain`: the policy said only "reserved"
        return f"{held}; {decision.reason}"
    return f"{held} (when running jobs end by their limits); now {decision.shortage}"


def _utc(epoch: float) -> str:
    """ISO 8601 to the minute (the reader adds the relative time: apps/admission/waiting.py)."""
    return waiting.iso_minute(datetime.fromtimestamp(epoch, tz=UTC))


def _set_reason(reasons: dict[str, tuple[Job, str]], job: Job, reason: str) -> None:
    """The pass's last word for the job; written by `_write_reasons` if it changed."""
    reasons[str(job.pk)] = (job, reason[:300])


def _write_reasons(reasons: dict[str, tuple[Job, str]]) -> None:
    """One UPDATE per `REASON_BATCH` changed reasons, each guarded as a job's own update was
    (still queued, same version): a pass over a long queue writes only what changed. The words
    and the start estimate come from the plan (apps/scheduling/plan.py) and are written together:
    a job whose estimate changed is written even where its reason did not."""
    planner, at = plan.PLANNER, timezone.now()
    changed = []
    for job, reason in reasons.values():
        worded = planner.worded(job, reason)[:300]
        estimate = planner.changed(job)
        if job.reason != worded or estimate is not None:
            changed.append((job, worded, estimate))
    for start in range(0, len(changed), REASON_BATCH):
        batch = changed[start : start + REASON_BATCH]
        _update_reasons(batch, at)
        for job, reason, estimate in batch:
            job.reason = reason
            if estimate is not None:
                planner.stored(job, estimate, at)


_PLANNED = ("planned_start_at", "planned_start_earliest", "planned_start_latest",
            "planned_position", "planned_at")  # fmt: skip


def _update_reasons(batch: list[tuple[Job, str, plan.Estimate | None]], at) -> None:
    """One `UPDATE ... FROM (VALUES (id, version, reason, plan...), ...)`, guarded (still queued,
    same version). The ORM's CASE of 500 WHENs took 0.5 s of a pass's CPU to build for 1,000 new
    jobs' reasons; this statement is one string. A job whose estimate did not change keeps its
    stored one (written back as read)."""
    table = connection.ops.quote_name(Job._meta.db_table)
    pk = Job._meta.pk
    assert pk is not None
    typed = connection.vendor == "postgresql"  # a VALUES list's NULLs need a type there
    stamp, number = ("%s::timestamptz", "%s::integer") if typed else ("%s", "%s")
    row = f"(%s, %s, %s, {stamp}, {stamp}, {stamp}, {number}, {stamp})"
    rows = ", ".join([row] * len(batch))
    params: list = []
    moment = connection.ops.adapt_datetimefield_value
    for job, reason, estimate in batch:
        if estimate is not None:
            plan_values = [
                estimate.start,
                estimate.earliest,
                estimate.latest,
                estimate.position,
                at,
            ]
        else:
            plan_values = [getattr(job, name) for name in _PLANNED]
        stamps = [moment(v) if i != 3 else v for i, v in enumerate(plan_values)]
        params += [pk.get_db_prep_value(job.pk, connection), job.version, reason, *stamps]
    sets = ", ".join(
        f'"{name}" = v.column{index}' for index, name in enumerate(("reason", *_PLANNED), 3)
    )
    with connection.cursor() as cursor:
        cursor.execute(  # a VALUES list's columns are column1, column2, ... (both databases)
            f"UPDATE {table} SET {sets} FROM (VALUES {rows}) AS v "
            f'WHERE {table}."id" = v.column1 AND {table}."version" = v.column2 '
            f'AND {table}."state" = %s',
            [*params, JobState.QUEUED.value],
        )


def _held_reservations(jobs: dict) -> list[str]:
    """The jobs that held reservations last pass (one per pool at most), still queued."""
    try:
        raw = cast(bytes | None, client().get(RESERVATION_KEY))  # a sync client: never an Awaitable
    except Exception:
        return []
    held = raw.decode().split(",") if raw else []
    return [job_id for job_id in held if job_id in jobs]


def _store_reservations(job_ids: list[str]) -> None:
    try:
        client().set(RESERVATION_KEY, ",".join(job_ids[:64]), ex=3600)
    except Exception:
        log.warning("could not remember the reservations for %s", ", ".join(job_ids))


def queue_order():
    """Queued jobs in queue order (apps/jobs/queue_order.py): what `queue_position` counts (a job
    held by its dependencies waits for no GPU: it has no position and takes none)."""
    return Job.objects.filter(state=JobState.QUEUED, held_by_dependencies=False).order_by(
        *queue_order_of.order_by()
    )


def queue_position(job: Job) -> int | None:
    """1-based position among queued jobs in strict tier order, then submit time (a simple,
    explainable figure: the fair-share policy may start a job of a less-served tenant earlier)."""
    if job.state != JobState.QUEUED or job.held_by_dependencies:
        return None
    return queue_order().filter(_ahead_filter(job)).count() + 1


def queue_positions(jobs) -> dict:
    """`queue_position` of each queued job among `jobs` (a page), in one query; none for a job
    held by its dependencies (it waits for no GPU), and those take no place ahead of others."""
    queued = [job for job in jobs if job.state == JobState.QUEUED and not job.held_by_dependencies]
    if not queued:
        return {}
    counts = Job.objects.filter(state=JobState.QUEUED, held_by_dependencies=False).aggregate(
        **{f"p{i}": Count("pk", filter=_ahead_filter(job)) for i, job in enumerate(queued)}
    )
    return {job.pk: counts[f"p{i}"] + 1 for i, job in enumerate(queued)}


def _ahead_filter(job: Job) -> Q:
    return queue_order_of.ahead_of(job.tier.level, job.tier.rank, job.created_at)
