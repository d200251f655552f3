"""The scheduling policy: which queued job starts, where, what waits, and what gets preempted.

Plain data in, plain data out; no Django. The dispatcher and the simulator run this same code.

The seam the dispatcher calls once per tick::

    decisions = decide(
        now,                       # seconds (any epoch, the same clock as the times below)
        cluster,                   # ClusterManager holding every node and every running pod
        queued=[QueuedJob(...)],   # jobs waiting (a preempted job comes back with its first submit)
        running=[RunningJob(...)], # jobs holding GPUs (starting, running, preempting)
        tiers={"enterprise": TierPolicy(...), ...},
        tenant_usage={"acme": TenantUsage(tier="pro", gpu_seconds=...)},  # decayed, as of now
        config=PolicyConfig(),
        held_reservation=["job-17"],  # the job_ids of the last pass's Reserve decisions
    )

It returns, in the order they were taken:

- `Start(job_id, placement, reason)`: run the job on `placement` now.
- `Preempt(victim_ids, for_job_id, reason, cost_gpu_s)`: signal the victims to checkpoint and
  stop within the grace period. They keep their GPUs until they stop (pass them as running with
  `preempted_for=for_job_id` and `est_end` = signal + grace); `for_job_id` stays queued and holds
  the reservation, and a later pass starts it once the GPUs are free. It was checked (a dry run
  against the placement core) that it fits once the victims are gone.
- `Reserve(job_id, nodes, at, reason, shortage)`: the first blocked job holds these nodes from
  `at` on (EASY backfill; `config.reservations` > 1 gives that many blocked jobs one each); pass
  the ids back as `held_reservation` next tick so the holds are kept. `shortage` is what it
  still lacks now (with `explain`), for a caller that words the reservation itself.
- `Wait(job_id, reason)`: still queued, with the reason shown to the user (only with `explain`).

`decide` places the started jobs in `cluster` (victims stay until they stop), so a dispatcher
should build a fresh ClusterManager per tick. GPUs the cluster holds for pods that are not in
`running`, on cordoned nodes, or unhealthy count as busy. The simulator keeps one `Scheduler`
alive instead and feeds it events (`submit`, `finish`); both go through `Scheduler.decide`.

The rules (docs/scheduling.md has the formulas):

- strict priority between levels; inside a level, weighted fair share of GPUs between tiers (tiers
  under their guaranteed share first) and between tenants by usage decaying with `half_life_s`;
  submit order inside a tenant;
- aging, capped at the share: a job that has waited its tier's `age_limit_s` goes ahead of the
  non-aged jobs of its level, oldest first, if its tenant is below its max-min share of the tier
  and the job fits in what the tenant lacks of it; the level's oldest job past
  `aging_above_share` x `age_limit_s` goes first, one at a time, when no job of the level holds
  a reservation;
- a tier never holds more than guaranteed + borrowing limit;
- EASY backfill: the first blocked job of each resource pool (the nodes a job may use) gets a
  reservation on the nodes that free up first (from running jobs' estimated ends); later jobs
  start only if they end by then or leave those GPUs; the pass's window and miss count are per
  pool, so one pool's backlog never stops another's jobs;
- preemption: a job may preempt preemptible jobs of a lower level, or, when its tier is under its
  guarantee, of a same-level tier over its guarantee; victims must have run `min_runtime_s` and been
  preempted fewer than `max_preemptions` times; the cheapest set (GPU-time since last checkpoint
  plus restart cost) is chosen, and nothing is preempted unless the job then really fits.

Code map (docs/scheduling.md): the data in model.py, the state in scheduler.py,
a pass in passes.py; the rules it composes behind Protocols with named registries:
queue order in sort.py, backfill and reservations in backfill.py, preemption in
preemption.py with its cost in victims.py; the cluster it needs, cluster.py.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from apps.scheduling.core.policy.cluster import PolicyCluster
from apps.scheduling.core.policy.model import (
    FAIR_RECLAIM,
    HOUR,
    LN2,
    ArrivingNode,
    Decision,
    PolicyConfig,
    Preempt,
    QueuedJob,
    Reserve,
    RunningJob,
    Start,
    TenantUsage,
    TierPolicy,
    Wait,
    decayed_gpu_seconds,
    decayed_run,
    default_tiers,
    last_checkpoint,
)
from apps.scheduling.core.policy.scheduler import Scheduler, busy_beyond_running
from apps.scheduling.core.policy.sort import ORDERINGS, QueueSort
from apps.scheduling.core.policy.victims import VICTIM_COSTS, VictimCost

__all__ = [
    "FAIR_RECLAIM",
    "HOUR",
    "LN2",
    "ORDERINGS",
    "VICTIM_COSTS",
    "ArrivingNode",
    "Decision",
    "PolicyCluster",
    "PolicyConfig",
    "Preempt",
    "QueueSort",
    "QueuedJob",
    "Reserve",
    "RunningJob",
    "Scheduler",
    "Start",
    "TenantUsage",
    "TierPolicy",
    "VictimCost",
    "Wait",
    "decayed_gpu_seconds",
    "decayed_run",
    "decide",
    "default_tiers",
    "last_checkpoint",
]


def decide(
    now: float,
    cluster: PolicyCluster,
    queued: Iterable[QueuedJob],
    running: Iterable[RunningJob],
    tiers: Mapping[str, TierPolicy],
    tenant_usage: Mapping[str, TenantUsage] | None = None,
    *,
    config: PolicyConfig | None = None,
    held_reservation: str | Iterable[str] | None = None,
    tenant_weights: Mapping[str, float] | None = None,
    explain: bool = True,
    arriving: Iterable[ArrivingNode] = (),
) -> list[Decision]:
    """One scheduling pass over state rebuilt from plain data (see the module docstring).

    `arriving`: nodes being provisioned; a job whose tier has `preempt_wait_s` waits for them
    instead of preempting when enough fitting ones arrive within that time."""
    scheduler = Scheduler(cluster, tiers, config, tenant_weights=tenant_weights)
    for node in cluster.list_nodes():
        scheduler.add_node(node, in_cluster=True)
    for held in running:
        scheduler.restore_running(held)
    busy_beyond_running(scheduler, cluster)
    scheduler.reset_usage(now)
    for tenant, usage in (tenant_usage or {}).items():
        scheduler.set_usage(tenant, usage.tier, usage.gpu_seconds, now)
    for job in queued:
        scheduler.submit(job)
    scheduler.hold(held_reservation)
    scheduler.arriving = list(arriving)
    return scheduler.decide(now, explain=explain)
