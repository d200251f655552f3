"""The cluster as the dispatcher's passes see it, read from the database and kept between passes
(issue 18): nodes, GPUs, and every GPU held by an attempt, as the placement core's pods and the
policy's running jobs.

Reading it whole costs a pass ~0.9 s of CPU on 1,000 nodes x 8,000 attempts; checking it costs one
statement of aggregates (`pass_stamps`) and the nodes' rows. Each pass compares stamps of what the
state was read from with the database: the nodes' rows, the GPUs' count and unhealthy set, and over
the held GPU allocations their count, the sum of their ids and the sums of their attempts' and jobs'
versions (every transition bumps a version, and new rows have ids above every earlier one, so any
change moves one of these). Where only the allocations' stamp moved, the pass re-reads the
allocations and the rows of the attempts that changed; anything else (a node, a GPU, a tier's grace,
a setting, a placement the allocation index refused) reads it all again, and so does one pass every
`REBUILD_EVERY_S` (comparing the kept state with the fresh one, and logging a difference).
Checkpoint times are not versioned: re-read since the last pass, less a margin. The tenants' usage
(`UsageSpans`) is kept alike, and read whole on its own every `REBUILD_EVERY_S`.

The database stays the truth: a stale state can only make a placement lose its race (the job's
guarded update and the GPU allocation index refuse it), never allocate a GPU twice. The policy
places the pass's starts in the cluster and marks its victims: after the pass those starts are
taken out again and the victims re-read, so the state only ever holds what was read.
"""

from __future__ import annotations

import bisect
import gc
import logging
import math
import threading
import time
from dataclasses import dataclass, field
from datetime import UTC, timedelta
from typing import NamedTuple

from django.conf import settings
from django.db import connection
from django.utils import timezone
from django.utils.dateparse import parse_datetime

from apps.jobs.models import ATTEMPT_ACTIVE, AttemptState, GpuAllocation, Job, JobAttempt, JobState
from apps.nodes.models import Gpu, GpuHealth, NodeState
from apps.platform.db import prepared_cursor
from apps.scheduling import core, reads
from apps.scheduling.core import policy
from apps.scheduling.core.strategies import make_strategy
from apps.tenants.models import Tier

log = logging.getLogger(__name__)
HELD = "held:"  # pseudo-pods for GPUs still held by attempts that have ended (processes stopping)
STOPPING = "(stopping)"
# On a node whose agent cannot isolate jobs (isolation "none") a job's code can read what the
# agent can: only jobs that run the platform's own templates for tenants who may not run commands
# tolerate it, unless the operator opted the node in (Node.allow_unisolated_commands).
UNISOLATED_TAINT = "gpuplatform.io/unisolated=true:NoSchedule"
# A node whose agent fences its jobs carries this label in the cluster the policy sees, and a job
# in an OCI image selects it: images run only inside the fence (docs/images.md), so never on an
# unfenced node, even one opted in to commands.
FENCED_LABEL = "gpuplatform.io/fenced"
LIVE_JOB = (JobState.STARTING, JobState.RUNNING, JobState.PREEMPTING)
REBUILD_EVERY_S = 300.0  # a full read at least this often, compared with the kept state
DELTA_LIMIT = 2_000  # more changed attempts than this in one pass: read everything again
CHECKPOINT_MARGIN_S = 10.0  # a checkpoint's transaction commits within this of its time
# From this many held attempts, a full read freezes what it read out of the garbage collector's
# full collections: they scan every live object, and over a kept state of 8,000 attempts one
# took 0.15 s, every third pass (the state is long-lived: it needs no scanning).
FREEZE_FROM = 1_000


@dataclass
class ClusterSnapshot:
    cluster: core.ClusterManager
    gpu_ids: dict[tuple[str, int], int]  # (node name, GPU index) -> Gpu pk
    node_ids: dict[str, int]
    running: list[policy.RunningJob] = field(default_factory=list)


def epoch(moment) -> float:
    return moment.timestamp()


def taints(isolation: str, allow_unisolated_commands: bool) -> tuple[str, ...]:
    opted_in = allow_unisolated_commands or settings.TRUST_UNISOLATED_NODES
    return (UNISOLATED_TAINT,) if isolation == "none" and not opted_in else ()


def labels_of(labels: dict | None, isolation: str) -> dict[str, str]:
    """The node's labels, and FENCED_LABEL where its agent fences its jobs."""
    return {**(labels or {}), FENCED_LABEL: "true"} if isolation != "none" else dict(labels or {})


def selector_of(selector: dict | None, image: str) -> dict[str, str]:
    """The job's node selector, and FENCED_LABEL for a job in an image."""
    return {**(selector or {}), FENCED_LABEL: "true"} if image else dict(selector or {})


def tolerations_of(command, allow_commands: bool) -> tuple[str, ...]:
    """A job that may run arbitrary code (a command, or any job of a tenant allowed commands)
    does not tolerate an unisolated node."""
    return () if command or allow_commands else (UNISOLATED_TAINT,)


@dataclass
class Holding:
    """An attempt holding GPUs: its pod in the cluster and its running job for the policy."""

    pod: core.Pod
    placement: core.Placement
    running: policy.RunningJob
    allocations: frozenset[tuple[int, int]]  # (GpuAllocation pk, Gpu pk)
    versions: tuple[int, int]  # the attempt's and its job's, as the allocations were read
    stop_grace_s: float | None  # stopping: it releases its GPUs within this (tier grace)
    # The job's user, template and max_runtime_seconds: the start plan's runtime predictor
    # (apps/scheduling/plan.py) needs them, and this read already has the job's row.
    facts: tuple[int, int | None, float] | None = None


@dataclass
class Stamp:
    """What a kept state was read from, compared with the database each pass."""

    nodes: list[tuple]
    gpus: tuple
    allocations: tuple  # count, sum of ids, sum of attempt versions, sum of job versions
    settings: tuple


class State:
    """One read of the cluster, kept and brought up to date between passes."""

    def __init__(self, strategy: core.Strategy | str | None) -> None:
        self.cluster = core.ClusterManager(strategy=strategy) if strategy else core.ClusterManager()
        self.gpu_ids: dict[tuple[str, int], int] = {}
        self.node_ids: dict[str, int] = {}
        self.gpu_at: dict[int, tuple[str, int]] = {}  # Gpu pk -> (node name, GPU index)
        self.holdings: dict[int, Holding] = {}  # by attempt pk
        self.stamp: Stamp | None = None
        self.read_at = time.monotonic()
        self.checkpoints_since = timezone.now()
        self.dirty: set[str] = set()  # pod names to read again (the policy changed them)
        self.usable = 0  # healthy GPUs on ready nodes, as read (a change reads it all again)
        # The queue's heads the last pass holding this state got (dispatcher.ordered_queue), by
        # job id: a head whose row has not changed is not read and built again.
        self.heads: dict = {}
        # The running attempts' stamp as this pass's read (full or not) read it (`pass_stamps`),
        # for the usage (`Kept.usage`): taken once.
        self.live_read: tuple | None = None

    # --- a full read ------------------------------------------------------------------------

    def load(self, tiers: list[Tier] | None = None) -> State:
        """Every node that is not lost (cordoned and draining ones take no new work), its
        unhealthy GPUs marked unusable, and every GPU held by an attempt restored as a pod. Read
        as plain rows (values_list): no model objects for 1,000 nodes and 8,000 attempts. The
        stamps are read before the rows they cover, so a change in between shows next pass
        (`tiers`: the pass's Tier rows, read before this, for the stamp of their graces)."""
        stamps = pass_stamps(tiers)
        self.live_read = stamps.live
        nodes = node_rows()
        gpus_of: dict[int, dict[int, tuple[int, str]]] = {}
        for pk, node_id, index, health in Gpu.objects.order_by().values_list(
            "pk", "node_id", "index", "health"
        ):
            gpus_of.setdefault(node_id, {})[index] = (pk, health)
        cluster = self.cluster
        for pk, name, sku, labels, state, isolation, allow in nodes:
            gpus = gpus_of.get(pk, {})
            size = max(gpus, default=-1) + 1
            cluster.add_node(core.Node(name=name, gpus=size, gpu_model=sku,
                                       labels=labels_of(labels, isolation),
                                       taints=taints(isolation, allow)))  # fmt: skip
            self.node_ids[name] = pk
            if state != NodeState.READY:
                cluster.cordon(name)
            else:
                self.usable += sum(1 for _, health in gpus.values() if health == GpuHealth.HEALTHY)
            for index in range(size):
                gpu = gpus.get(index)
                if gpu is None or gpu[1] != GpuHealth.HEALTHY:
                    cluster.set_gpu_health(name, index, False)
                if gpu is not None:
                    self.gpu_ids[(name, index)] = gpu[0]
                    self.gpu_at[gpu[0]] = (name, index)
        allocations = allocation_rows()
        self._hold(allocations, set(self._attempts_of(allocations)))
        self.stamp = Stamp(nodes, stamps.gpus, allocation_stamp(allocations), stamps.settings)
        return self

    # --- bringing it up to date -------------------------------------------------------------

    def refresh(self, tiers: list[Tier] | None = None) -> bool:
        """Bring the state up to date with the database; False when only a full read can (a node,
        a GPU or a setting changed, or too much at once). `tiers` as for `load`."""
        assert self.stamp is not None
        since, self.checkpoints_since = self.checkpoints_since, timezone.now()
        after = since - timedelta(seconds=CHECKPOINT_MARGIN_S)
        stamps = pass_stamps(tiers, checkpoints_after=after)
        self.live_read = stamps.live
        if stamps.settings != self.stamp.settings or stamps.gpus != self.stamp.gpus:
            return False
        if node_rows() != self.stamp.nodes:
            return False
        dirty = {h for h, held in self.holdings.items() if held.pod.name in self.dirty}
        self.dirty.clear()
        if dirty or stamps.allocations != self.stamp.allocations:
            allocations = allocation_rows()
            if not self._apply_changes(allocations, dirty):
                return False
            self.stamp.allocations = allocation_stamp(allocations)
        self._saw_checkpoints(stamps.checkpoints)
        return True

    def _apply_changes(self, allocations: list[tuple], dirty: set[int]) -> bool:
        """Drop the attempts whose allocations or versions changed and read them again."""
        now = self._attempts_of(allocations)
        changed = {pk for pk, key in now.items() if self._key_of(pk) != key} | (dirty & set(now))
        gone = [pk for pk in self.holdings if pk not in now]
        if len(changed) + len(gone) > DELTA_LIMIT:
            return False
        for pk in [*gone, *changed]:
            held = self.holdings.pop(pk, None)
            if held is not None:
                self.cluster.remove_pod(held.pod.name)
        try:
            self._hold([row for row in allocations if row[1] in changed], changed)
        except ValueError:  # a pod that does not fit what is kept: the state is off somewhere
            log.warning("kept cluster state: a changed allocation does not fit; reading it all")
            return False
        return True

    def _key_of(self, attempt_pk: int) -> tuple | None:
        held = self.holdings.get(attempt_pk)
        return (held.allocations, held.versions) if held else None

    @staticmethod
    def _attempts_of(allocations: list[tuple]) -> dict[int, tuple]:
        """Per attempt: its allocations and versions, as `_key_of` gives them."""
        found: dict[int, tuple[set, tuple[int, int]]] = {}
        for pk, attempt_id, gpu_id, attempt_version, job_version in allocations:
            entry = found.setdefault(attempt_id, (set(), (attempt_version, job_version)))
            entry[0].add((pk, gpu_id))
        return {pk: (frozenset(ids), versions) for pk, (ids, versions) in found.items()}

    def _hold(self, allocations: list[tuple], attempts: set[int]) -> None:
        """Pods and running jobs for `attempts`, from their allocation rows and attempt rows."""
        if not attempts:
            return
        by_attempt: dict[int, dict[str, list[int]]] = {}
        keys = self._attempts_of(allocations)
        for _pk, attempt_id, gpu_id, _av, _jv in allocations:
            at = self.gpu_at.get(gpu_id)
            if at is not None:  # a GPU of a lost node: it holds nothing the policy can use
                by_attempt.setdefault(attempt_id, {}).setdefault(at[0], []).append(at[1])
        # Over 500, a subquery: thousands of ids as parameters cost more (on SQLite).
        rows = reads.attempt_rows(None if len(attempts) > 500 else sorted(attempts))
        now = timezone.now()
        pods: list[tuple[core.Pod, core.Placement]] = []
        for row in rows:
            by_node = by_attempt.get(row[0])
            if by_node is None or row[0] not in attempts:  # allocated after the rows were read
                continue
            allocs, versions = keys[row[0]]
            held = _holding(row, by_node, now, allocs, versions)
            self.holdings[row[0]] = held
            pods.append((held.pod, held.placement))
        self.cluster.add_pods(pods)  # each node re-indexed once

    def _saw_checkpoints(self, rows: list[tuple]) -> None:
        """Checkpoints saved since the last pass (not versioned: read by time, with a margin, in
        `pass_stamps`), as (attempt pk, checkpoint time). Read before the allocations: an attempt
        held again since has its own row's, as new or newer (a checkpoint time only moves on)."""
        for pk, checkpoint_at in rows:
            held = self.holdings.get(pk)
            if held is not None:
                at, last = epoch(checkpoint_at), held.running.last_checkpoint_at
                held.running.last_checkpoint_at = at if last is None else max(last, at)

    # --- what a pass gets -------------------------------------------------------------------

    def free_gpus(self) -> int:
        """Healthy GPUs on ready nodes less every GPU held (wherever it is), as the state was
        last checked: what the dispatcher's two counts gave (`dispatcher.pass_window`). Nodes
        and GPUs are as read (any change to them reads the state again), the held GPUs are the
        allocations' count in the stamp each pass checks."""
        assert self.stamp is not None
        return max(0, self.usable - self.stamp.allocations[0])

    def snapshot(self, strategy: core.Strategy | str | None) -> ClusterSnapshot:
        """The state for one pass: the pass's placement strategy, and the stopping jobs' ends
        from now (they release their GPUs within their grace)."""
        if isinstance(strategy, core.Strategy):
            self.cluster.strategy = strategy
        now = epoch(timezone.now())
        running = []
        for held in self.holdings.values():
            if held.stop_grace_s is not None:
                held.running.est_end = now + held.stop_grace_s + settings.KILL_GRACE_SECONDS
            running.append(held.running)
        return ClusterSnapshot(
            cluster=self.cluster, gpu_ids=self.gpu_ids, node_ids=self.node_ids, running=running
        )

    def after_pass(self, decisions) -> None:
        """Take the pass's starts out of the cluster (read back next pass if they were applied)
        and mark its victims to be read again (the policy moved their ends)."""
        for decision in decisions:
            if isinstance(decision, policy.Start):
                self.cluster.remove_pod(decision.job_id)
            elif isinstance(decision, policy.Preempt):
                self.dirty.update(decision.victim_ids)

    def same_as(self, other: State) -> bool:
        """Whether two reads hold the same nodes, pods and running jobs (stopping ends aside)."""
        mine, theirs = self.cluster, other.cluster
        if mine.list_nodes() != theirs.list_nodes():
            return False
        for node in mine.list_nodes():
            a, b = mine.node_view(node.name), theirs.node_view(node.name)
            if (a.free_milli, a.healthy, a.cordoned, a.pods) != (
                b.free_milli, b.healthy, b.cordoned, b.pods
            ):  # fmt: skip
                return False
        return _running_of(self) == _running_of(other)


def job_facts(state: State) -> dict[str, tuple[int, int | None, float]]:
    """{job id: (user id, template id, max_runtime_seconds)} of the jobs holding GPUs."""
    return {
        held.running.job_id: held.facts
        for held in state.holdings.values()
        if held.facts is not None and not held.running.job_id.startswith(HELD)
    }


def _running_of(state: State) -> dict[int, tuple]:
    out = {}
    for pk, held in state.holdings.items():
        job = held.running
        est_end = None if held.stop_grace_s is not None else job.est_end
        out[pk] = (job.job_id, job.tenant, job.tier, job.gpus, job.nodes, job.started_at, est_end,
                   job.placement, job.last_checkpoint_at, job.preemptions, job.gpu_models,
                   dict(job.node_selector), job.preempted_for, job.tolerations)  # fmt: skip
    return out


def _holding(row: tuple, by_node: dict[str, list[int]], now, allocations, versions) -> Holding:
    (pk, state, started_at, created_at, checkpoint_at, preempted_for, job_id, job_state, tenant,
     allow_commands, tier, grace_s, max_runtime, preemptions, sku, selector, command, user,
     template, image) = row  # fmt: skip
    live = state in ATTEMPT_ACTIVE and job_state in LIVE_JOB
    name = str(job_id) if live else f"{HELD}{pk}"
    placement = core.Placement(
        assignments=[
            core.Assignment(node=n, gpu_indices=sorted(ix), gpu_milli=[core.MILLI] * len(ix))
            for n, ix in sorted(by_node.items())
        ]
    )
    per_node = max(len(ix) for ix in by_node.values())
    started = started_at or created_at
    stopping = not live or state == AttemptState.PREEMPTING
    grace = timedelta(seconds=grace_s + settings.KILL_GRACE_SECONDS)
    running = policy.RunningJob(
        job_id=name, tenant=tenant, tier=tier, gpus=per_node, nodes=len(by_node),
        started_at=epoch(started),
        est_end=epoch(now + grace) if stopping else epoch(started) + max_runtime,
        placement=placement,
        last_checkpoint_at=epoch(checkpoint_at) if checkpoint_at else None,
        preemptions=preemptions,
        gpu_models=(sku,) if sku else (),
        node_selector=selector_of(selector, image),
        preempted_for=(preempted_for or STOPPING) if stopping else None,
        tolerations=tolerations_of(command, allow_commands),
    )  # fmt: skip
    pod = core.Pod(name=name, gpus=per_node, nodes=len(by_node))
    return Holding(pod, placement, running, allocations, versions,
                   float(grace_s) if stopping else None, (user, template, float(max_runtime)))  # fmt: skip


# --- the stamps ---------------------------------------------------------------------------------


def node_rows() -> list[tuple]:
    """`reads.NODE_FIELDS` of the nodes not lost or terminated, by name (apps/scheduling/reads.py)."""
    return reads.node_rows()


def allocation_rows() -> list[tuple]:
    """`reads.ALLOCATION_FIELDS` of the held GPU allocations (apps/scheduling/reads.py)."""
    return reads.allocation_rows()


def allocation_stamp(rows: list[tuple]) -> tuple:
    """The held allocations' count, sum of ids, and sums of their attempts' and jobs' versions."""
    return (len(rows), sum(r[0] for r in rows), sum(r[3] for r in rows), sum(r[4] for r in rows))


class PassStamps(NamedTuple):
    """What the kept state and usage were read from, as `pass_stamps` reads them. Each is only
    ever compared with the same stamp's earlier value."""

    # The tiers' graces, the tenants allowed commands (their running jobs' tolerations) and the
    # settings read.
    settings: tuple
    # The GPUs' count, sum of ids and unhealthy ids: a GPU row is made once per (node, index) and
    # never changes node or index, so these say everything a pass reads of them.
    gpus: tuple
    allocations: tuple  # `allocation_stamp` of the held allocations, summed by the database
    # The running attempts' count, sum of ids and latest start: one that ends lowers the count,
    # one that starts (started_at set at its move to running) moves the latest start.
    live: tuple
    checkpoints: list[tuple]  # (attempt pk, checkpoint time) saved since `checkpoints_after`


def _fetch(sql: str, params: tuple = ()) -> list[tuple]:
    """On `prepared_cursor`: the stamps' two texts (with the checkpoints' read or without) are
    prepared on PostgreSQL, not parsed and planned every pass."""
    with prepared_cursor() as cursor:
        cursor.execute(sql, params)
        return cursor.fetchall()


# The active states written into the statement, not passed as parameters: SQLite plans a
# statement before it sees its parameters, and reads a partial index only for a condition that
# names its rows as the index's does (attempt_one_active_per_job's, the same states in the same
# order); with parameters the checkpoints' read went through every attempt ever made (24 ms of a
# pass's 25 ms of stamps with 200,000 of them: docs/bench/71-slurm-peer-notes.md, "h37index
# pass"). Code's own constants, never a value from outside.
_ACTIVE_STATES = ", ".join(f"'{state.value}'" for state in ATTEMPT_ACTIVE)


def pass_stamps(tiers: list[Tier] | None = None, checkpoints_after=None) -> PassStamps:
    """Every stamp in one statement (a UNION ALL of tagged rows), with the active attempts'
    checkpoints saved at or after `checkpoints_after` (none read when None); `tiers`: the pass's
    Tier rows (read here when None). A pass that keeps its state checks these, a full read and
    the usage's first read keep them. SQL written once: the ORM built each statement anew every
    pass (0.3-0.4 ms of CPU each, for a read of microseconds). Six statements were six round
    trips, each of which on PostgreSQL waits for the server's process to be scheduled (on the
    2-core bench machine, under load, more than the read itself: docs/bench/71-slurm-peer-notes.md,
    "h36start pass")."""
    from apps.tenants.models import Tenant

    if tiers is None:
        tiers = list(Tier.objects.all())
    gpu, moment = Gpu._meta.db_table, connection.ops.adapt_datetimefield_value
    tables = GpuAllocation._meta.db_table, JobAttempt._meta.db_table, Job._meta.db_table
    # The running attempts' row first: PostgreSQL types a UNION's columns pairwise from the left,
    # and two NULLs first would make the last column text.
    rows = _fetch(
        "SELECT 4, COUNT(id), SUM(id), 0, 0, MAX(started_at) FROM {1} "
        "WHERE started_at IS NOT NULL AND ended_at IS NULL "
        "UNION ALL SELECT 0, COUNT(id), SUM(id), 0, 0, NULL FROM {3} "
        "UNION ALL SELECT 1, id, 0, 0, 0, NULL FROM {3} WHERE health <> %s "
        "UNION ALL SELECT 2, id, 0, 0, 0, NULL FROM {4} WHERE allow_commands "
        "UNION ALL SELECT 3, COUNT(g.id), SUM(g.id), SUM(a.version), SUM(j.version), NULL "
        "FROM {0} g JOIN {1} a ON a.id = g.attempt_id JOIN {2} j ON j.id = a.job_id "
        "WHERE g.released_at IS NULL".format(*tables, gpu, Tenant._meta.db_table)
        + ("" if checkpoints_after is None else
           f" UNION ALL SELECT 5, id, 0, 0, 0, checkpoint_at FROM {tables[1]} "
           f"WHERE state IN ({_ACTIVE_STATES}) AND checkpoint_at >= %s"),
        (GpuHealth.HEALTHY.value, *([] if checkpoints_after is None else
                                    [moment(checkpoints_after)])),
    )  # fmt: skip
    # A UNION's column takes the widest type of its rows (PostgreSQL: a SUM of bigints is a
    # numeric): every number back to an int (a sum over no rows to 0), every time to an aware
    # datetime (SQLite gives its raw text).
    values = {kind: [(*(0 if v is None else int(v) for v in row[1:5]), _aware(row[5]))
                     for row in rows if row[0] == kind] for kind in range(6)}  # fmt: skip
    ((count, ids, _, _, _),) = values[0]
    graces = tuple(sorted((tier.pk, tier.preemption_grace_seconds) for tier in tiers))
    allowed = tuple(sorted(row[0] for row in values[2]))
    ((held, held_ids, attempt_versions, job_versions, _),) = values[3]
    ((live, live_ids, _, _, latest),) = values[4]
    return PassStamps(
        settings=(graces, allowed, settings.TRUST_UNISOLATED_NODES, settings.KILL_GRACE_SECONDS),
        gpus=(count, ids, tuple(sorted(row[0] for row in values[1]))),
        allocations=(held, held_ids, attempt_versions, job_versions),
        live=(live, live_ids, latest),
        checkpoints=[(row[0], row[4]) for row in values[5]],
    )


def _aware(value):
    """A time read raw (SQLite: its text, naive UTC as Django stores it) as a datetime."""
    if isinstance(value, str):
        value = parse_datetime(value)
    if value is not None and timezone.is_naive(value):
        value = timezone.make_aware(value, UTC)
    return value


# --- usage: what every attempt that ran in the policy's window used --------------------------


class UsageSpans:
    """Per attempt that ran within four half-lives: (tenant, tier, start, end or None, GPUs),
    kept between passes. The running ones are checked by a stamp (`PassStamps.live`): when it
    moves, the ids are read and the attempts that came or went read by id;
    those that ended are also read by their end time (since the last pass, less a margin), which
    catches an attempt that started and ended between two passes.

    The usage is summed as it changes, not again each pass: an ended attempt's decayed
    GPU-seconds only shrink, by the same factor for all, so each tenant's ended attempts are kept
    as one sum valued at a reference time (`_ref`), scaled to the pass's time when read; a pass
    adds the attempts that ended since, takes out those that left the window, and sums only the
    running ones (a drain's pass went through every attempt of the last four half-lives, a tenth
    of the dispatcher's time). An end read after the pass's time (committed as the pass began)
    counts whole, where a sum at that time would cut it there: milliseconds of GPU time."""

    def __init__(self, since, live: tuple | None = None) -> None:
        """`live`: the running attempts' stamp as the pass read it already (`PassStamps.live`,
        read before these rows; read here when None)."""
        self.since = since  # the window's start when read: a longer window reads again
        self.read_at = time.monotonic()  # read whole again `REBUILD_EVERY_S` after (Kept.usage)
        self.spans: dict[int, tuple] = {}
        self.running: set[int] = set()  # the spans without an end
        # Each tenant's span ids, sorted: its usage's tier is its lowest one's, as a sum over the
        # spans in id order had it.
        self.ids_of: dict[str, list[int]] = {}
        # Per span: its job's user and template and whether it succeeded (the start plan's
        # history of run lengths, apps/scheduling/plan.py: no read of its own).
        self.kinds: dict[int, tuple[int, int | None, bool]] = {}
        self._ended: dict[str, float] = {}  # tenant: its ended spans' usage valued at _ref
        self._ref: float | None = None  # None: nothing summed yet
        self._half_life = 0.0
        self.stamp = pass_stamps().live if live is None else live
        self.ended_checked = timezone.now()
        self._add(reads.span_rows(since=since))

    def refresh(self, since, stamp: tuple | None = None) -> bool:
        """Up to date with the database; False when the window grew (read it all again).
        `stamp`: `PassStamps.live` as the pass read it already (read here when None)."""
        if since < self.since:
            return False
        stamp = pass_stamps().live if stamp is None else stamp
        moved: set[int] = set()  # the attempts that started or ended since the last check
        if stamp != self.stamp:
            live = set(reads.live_attempt_ids())
            moved = (live - self.running) | (self.running - live)
            if len(moved) > DELTA_LIMIT:
                return False
            for pk in self.running - live:
                self._drop(pk)
            self.stamp = stamp
        checked, self.ended_checked = self.ended_checked, timezone.now()
        after = checked - timedelta(seconds=CHECKPOINT_MARGIN_S)
        # One look at the ended spans: those within the margin are not read again (an attempt's
        # end is written once; in a drain at 60 jobs a second the margin held ~600 of them, read
        # whole with two joins each pass), those before the window's start leave it.
        after_s, start = epoch(after), epoch(since)
        known, gone = [], []
        for pk, span in self.spans.items():
            if span[3] is not None:
                if span[3] >= after_s:
                    known.append(pk)
                elif span[3] < start:
                    gone.append(pk)
        # The moved attempts in the same read: a round trip less in a pass after an end.
        self._add(reads.span_rows(ended_after=after, known=known if len(known) <= DELTA_LIMIT else None,
                                  also=sorted(moved)))  # fmt: skip
        for pk in gone:
            self._drop(pk)
        return True

    def _add(self, rows: list[tuple]) -> None:
        """The spans of `rows` (`reads.SPAN_FIELDS` of attempts)."""
        for row in rows:
            pk, tenant, tier, started, ended, gpus, nodes, user, template, state = row
            span = (tenant, tier, epoch(started), epoch(ended) if ended else None, gpus * nodes)
            kind = (user, template, state == AttemptState.SUCCEEDED)
            if self.spans.get(pk) == span:
                self.kinds[pk] = kind
                continue  # an ended one read again (the end-time read's margin)
            self._drop(pk)
            self.kinds[pk] = kind
            self.spans[pk] = span
            if span[3] is None:
                self.running.add(pk)
            else:
                self._fold(span, +1.0)
            bisect.insort(self.ids_of.setdefault(tenant, []), pk)

    def _drop(self, pk: int) -> None:
        span = self.spans.pop(pk, None)
        self.kinds.pop(pk, None)
        if span is None:
            return
        self.running.discard(pk)
        if span[3] is not None:
            self._fold(span, -1.0)
        ids = self.ids_of[span[0]]
        del ids[bisect.bisect_left(ids, pk)]
        if not ids:
            del self.ids_of[span[0]]

    def _fold(self, span: tuple, sign: float) -> None:
        """Add (or take out) an ended span's usage, valued at _ref, to its tenant's sum."""
        if self._ref is None:
            return  # summed from the spans at the first `usage`
        tenant, _, started, ended, gpus = span
        value = policy.decayed_run(started, ended, gpus, self._ref, self._half_life)
        self._ended[tenant] = self._ended.get(tenant, 0.0) + sign * value

    def runs(self) -> dict[tuple[int, int | None], list[float]]:
        """{(user, template): lengths of its succeeded attempts in the window, latest end first}."""
        ended = sorted(
            ((span[3], pk) for pk, span in self.spans.items() if span[3] is not None), reverse=True
        )
        out: dict[tuple[int, int | None], list[float]] = {}
        for end, pk in ended:
            user, template, succeeded = self.kinds.get(pk, (0, None, False))
            if succeeded:
                out.setdefault((user, template), []).append(end - self.spans[pk][2])
        return out

    def usage(self, now, half_life_s: float) -> dict[str, policy.TenantUsage]:
        at = epoch(now)
        if self._ref is None or half_life_s != self._half_life or at - self._ref > half_life_s:
            # Summed afresh, valued at now: the first time, for another half-life, and once a
            # half-life, so that no value grows past twice its size (no loss of precision).
            self._ref, self._half_life, self._ended = at, half_life_s, {}
            for span in self.spans.values():
                if span[3] is not None:
                    self._fold(span, +1.0)
        scale = math.exp(-policy.LN2 * (at - self._ref) / half_life_s)
        totals = {tenant: max(0.0, value) * scale for tenant, value in self._ended.items()}
        running: dict[str, list] = {}
        for pk in self.running:
            tenant, _, started, _, gpus = self.spans[pk]
            running.setdefault(tenant, []).append((started, at, gpus))
        for tenant, spans in running.items():
            totals[tenant] = totals.get(tenant, 0.0) + policy.decayed_gpu_seconds(
                spans, at, half_life_s
            )
        return {
            tenant: policy.TenantUsage(
                tier=self.spans[self.ids_of[tenant][0]][1], gpu_seconds=gpu_seconds
            )
            for tenant, gpu_seconds in totals.items()
            if tenant in self.ids_of
        }


def tenant_usage(
    now, half_life_s: float, live: tuple | None = None
) -> dict[str, policy.TenantUsage]:
    """Each tenant's GPU-seconds, decayed with the policy's half-life, from recent attempts
    (`live` as for `UsageSpans`)."""
    return UsageSpans(now - timedelta(seconds=4 * half_life_s), live).usage(now, half_life_s)


# --- the one kept state per process -----------------------------------------------------------


class Kept:
    """The process's kept state. One pass at a time uses it (the leader lock normally sees to
    that; a pass that finds it in use reads its own)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._state: State | None = None
        self._usage: UsageSpans | None = None
        self._suspect = False
        self.rebuilds = 0  # full reads, for tests and the bench

    def suspect(self) -> None:
        """Something disagreed with the kept state (a placement refused by the GPU allocation
        index): read it all at the next pass."""
        self._suspect = True

    def current(self) -> State | None:
        """The state kept now (None before the first pass, or after a failed one)."""
        return self._state

    def fragmentation(self) -> float | None:
        """The kept cluster's fragmentation (the core's measure: the share of free GPU capacity
        the workload seen could not use), as `/metrics` exports it; None when nothing is kept or
        a pass holds the state now."""
        if not self._lock.acquire(blocking=False):
            return None
        try:
            state = self._state
            return None if state is None else float(state.cluster.utilization()["fragmentation"])
        finally:
            self._lock.release()

    def forget(self) -> None:
        with self._lock:
            self._state = self._usage = None
            if gc.get_freeze_count():
                gc.unfreeze()

    def usage(self, state: State, now, half_life_s: float) -> dict[str, policy.TenantUsage]:
        """`tenant_usage` from the kept spans, for the pass holding `state`."""
        stamp, state.live_read = state.live_read, None
        if state is not self._state:
            return tenant_usage(now, half_life_s, stamp)
        since = now - timedelta(seconds=4 * half_life_s)
        spans = self._usage
        # Read whole on its own clock, not at each full read of the cluster: a node that comes or
        # goes changes no attempt's usage, and the whole window's attempts are the costly read.
        due = spans is None or time.monotonic() - spans.read_at >= REBUILD_EVERY_S
        if spans is None or due or not spans.refresh(since, stamp):
            spans = self._usage = UsageSpans(since, stamp)
        return spans.usage(now, half_life_s)

    def runs(self) -> dict[tuple[int, int | None], list[float]] | None:
        """The run lengths of the usage's window (UsageSpans.runs), None before any pass."""
        return self._usage.runs() if self._usage is not None else None

    def pass_state(
        self, strategy: core.Strategy | str | None, tiers: list[Tier] | None = None
    ) -> State:
        """The up-to-date state for a pass; hand it back with `done` (or `failed`). `tiers`:
        the pass's Tier rows (for the stamp of their graces; read here when None)."""
        if not self._lock.acquire(blocking=False):
            return State(strategy).load(tiers)  # another pass holds it: a state of its own
        try:
            state = self._current(strategy, tiers)
        except BaseException:
            self._state = self._usage = None
            self._lock.release()
            raise
        return state

    def _current(self, strategy: core.Strategy | str | None, tiers: list[Tier] | None) -> State:
        state = self._state
        fresh_due = state is None or time.monotonic() - state.read_at >= REBUILD_EVERY_S
        fresh_due, self._suspect = fresh_due or self._suspect, False
        if state is not None and type(state.cluster.strategy) is not type(make_strategy(strategy)):
            state = None  # a strategy of another kind indexes the nodes otherwise
        if state is not None and not fresh_due and state.refresh(tiers):
            return state
        # Due for a full read: bring the kept state up to date first, then compare the two.
        compare = state is not None and fresh_due and state.refresh(tiers)
        fresh = State(strategy).load(tiers)
        self.rebuilds += 1
        if compare and state is not None and not state.same_as(fresh):
            log.warning("the kept cluster state differed from a full read (or the cluster changed "
                        "in between); kept the full read")  # fmt: skip
        self._keep(fresh)
        return fresh

    def _keep(self, fresh: State) -> None:
        self._state = fresh
        if gc.get_freeze_count() or len(fresh.holdings) >= FREEZE_FROM:
            gc.unfreeze()
            gc.collect()  # the state read before, whose nodes and pools refer to each other
            gc.freeze()

    def done(self, state: State, decisions) -> None:
        if state is self._state:
            state.after_pass(decisions)
            self._lock.release()

    def failed(self, state: State) -> None:
        """The pass stopped half-way: what the policy did to the state is unknown."""
        if state is self._state:
            self._state = self._usage = None
            self._lock.release()


KEPT = Kept()
