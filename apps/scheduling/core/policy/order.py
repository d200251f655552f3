"""Queue order: which queued job the policy looks at next.

Queued jobs live in one list per (tier, tenant), sorted by original submit time, so arrivals
append in O(1) amortised and a pass walks only as far as it needs (a lazy merge, O(log Q) per job
yielded for Q tenant queues). The orders:

- `fair` (the default policy): levels high to low; inside a level by weighted fair share: the
  tier with the lowest usage/weight (tiers under their guaranteed share first), inside it the
  tenant with the lowest decayed usage/weight, inside the tenant by submit time. Each job
  yielded is charged to its tier and tenant, so one pass interleaves tenants like WFQ. Ahead of
  that, aging capped at the share (`_fair_level_to_share`): the level's one *overdue* job, then
  the *aged* jobs (waited their tier's `age_limit_s`) of tenants below their max-min share, as
  far as they fit in it. (Without shares, every aged job first, oldest first: `_fair_level`.)
- `level-fifo` (`strict`): levels high to low, submit order inside a level.
- `fifo`: submit order over everything.
- `slurm`: multifactor priority (QOS + fair-share + age), recomputed every `calc_period_s` like
  Slurm's PriorityCalcPeriod; see `SlurmPriority`.
"""

from __future__ import annotations

import heapq
import math
from bisect import bisect_right, insort
from collections.abc import Callable, Iterable, Iterator, Sequence
from itertools import islice
from typing import Any

INF = math.inf


class TenantQueue:
    """One tenant's queued jobs of one tier, as `(submit, seq, job)` sorted by submit."""

    __slots__ = ("tenant", "tier", "items", "gpus", "gangs")

    def __init__(self, tenant: str, tier: str) -> None:
        self.tenant = tenant
        self.tier = tier
        self.items: list[tuple[float, int, Any]] = []
        self.gpus = 0  # GPUs the queued jobs ask for (all their nodes)
        self.gangs: list[tuple[float, int, Any]] = []  # the multi-node ones, also by submit

    def add(self, submit: float, seq: int, job: Any) -> None:
        """O(log n) search; append in the common case of a later submit."""
        self.gpus += job.gpus * job.nodes
        entry = (submit, seq, job)
        for items in (self.items, self.gangs) if job.nodes > 1 else (self.items,):
            if not items or items[-1][:2] < entry[:2]:
                items.append(entry)
            else:
                insort(items, entry, key=lambda e: (e[0], e[1]))

    def remove(self, submit: float, seq: int) -> None:
        """O(log n) search + O(n) memmove."""
        i = bisect_right(self.items, (submit, seq), key=lambda e: (e[0], e[1])) - 1
        if i < 0 or self.items[i][1] != seq:
            raise KeyError(seq)
        job = self.items[i][2]
        self.gpus -= job.gpus * job.nodes
        del self.items[i]
        if job.nodes > 1:
            k = bisect_right(self.gangs, (submit, seq), key=lambda e: (e[0], e[1])) - 1
            del self.gangs[k]


class QueueIndex:
    """All queued jobs, grouped level -> tier -> tenant."""

    def __init__(self, level_of: Callable[[str], int]) -> None:
        self._level_of = level_of
        self.by_tier: dict[str, dict[str, TenantQueue]] = {}
        self.levels: dict[int, list[str]] = {}
        self.count = 0

    def _queue(self, tier: str, tenant: str) -> TenantQueue:
        tenants = self.by_tier.get(tier)
        if tenants is None:
            tenants = self.by_tier[tier] = {}
            level = self._level_of(tier)
            self.levels.setdefault(level, []).append(tier)
        tq = tenants.get(tenant)
        if tq is None:
            tq = tenants[tenant] = TenantQueue(tenant, tier)
        return tq

    def add(self, tier: str, tenant: str, submit: float, seq: int, job: Any) -> None:
        self._queue(tier, tenant).add(submit, seq, job)
        self.count += 1

    def remove(self, tier: str, tenant: str, submit: float, seq: int) -> None:
        self.by_tier[tier][tenant].remove(submit, seq)
        self.count -= 1

    def queues(self, tiers: list[str] | None = None) -> Iterator[TenantQueue]:
        for tier in self.by_tier if tiers is None else tiers:
            for tq in self.by_tier.get(tier, {}).values():
                if tq.items:
                    yield tq

    # --- orders -------------------------------------------------------------------------------

    def fifo(self) -> Iterator[Any]:
        """Submit order over every queue."""
        return _merged([tq.items for tq in self.queues()])

    def level_fifo(self) -> Iterator[Any]:
        for level in sorted(self.levels, reverse=True):
            yield from _merged([tq.items for tq in self.queues(self.levels[level])])

    def fair(
        self,
        now: float,
        age_limit: Callable[[str], float],
        tier_key: Callable[[str, float], tuple[int, float]],
        tier_weight: Callable[[str], float],
        tenant_key: Callable[[str, str], float],
        tenant_weight: Callable[[str], float],
        standing: Callable[[str, str], tuple[int, float, float]] | None = None,
        overdue_after: float = INF,
        overdue_waits: Callable[[Any], bool] | None = None,
        gangs_at_limit: bool = False,
    ) -> Iterator[Any]:
        """Levels high to low; aged jobs first; then weighted fair share (see module doc).

        `tier_key(tier, extra_gpus)` gives `(over_guarantee, usage/weight)` with `extra_gpus`
        already charged in this pass; `tenant_key(tier, tenant)` the tenant's usage/weight.
        With `standing(tier, tenant)` (running GPUs, max-min share, weight fraction), aging is
        capped at the share (`_fair_level_to_share`; the overdue job waits while
        `overdue_waits(job)`); without it, every aged job goes first (`_fair_level`).
        """
        for level in sorted(self.levels, reverse=True):
            if standing is None:
                yield from self._fair_level(
                    self.levels[level], now, age_limit, tier_key, tenant_key, tenant_weight
                )
                continue
            yield from self._fair_level_to_share(
                self.levels[level], now, age_limit, tier_key, tenant_key, tenant_weight,
                standing, overdue_after, overdue_waits, gangs_at_limit,
            )  # fmt: skip

    def _fair_level_to_share(
        self,
        tiers: list[str],
        now: float,
        age_limit: Callable[[str], float],
        tier_key: Callable[[str, float], tuple[int, float]],
        tenant_key: Callable[[str, str], float],
        tenant_weight: Callable[[str], float],
        standing: Callable[[str, str], tuple[int, float, float]],
        overdue_after: float,
        overdue_waits: Callable[[Any], bool] | None,
        gangs_at_limit: bool,
    ) -> Iterator[Any]:
        """Aging capped at the share, one overdue job, then weighted fair share.

        1. The *overdue* job: the level's oldest job that has waited `overdue_after` x A_T,
           whoever its tenant, unless `overdue_waits(job)` (a job of its level holds the
           reservation of its pool: that one starts first). One job: it starts or takes the
           reservation, then the next.
        2. The aged lane, oldest first: the aged jobs (waited A_T) of tenants below their
           max-min share, each only if it fits in what its tenant lacks of its share after the
           jobs lifted before it, the share counting the job's GPUs in the tier too (split by
           weight: `standing(tier, tenant)` = (running GPUs, share, weight fraction)); a
           tenant holding nothing has its first aged job lifted whatever its size. Aging
           brings a tenant up to its share, never past it, so a long queue buys no lane. With
           `gangs_at_limit`, the aged gangs of every tenant join the lane too.
        3. The rest by weighted fair share (`_weighted`), passing over the jobs lifted."""
        lifted: set[int] = set()
        streams: list[Iterator[tuple[float, int, Any]]] = []
        overdue: tuple[float, int, Any] | None = None
        for tier in tiers:
            limit = age_limit(tier)
            cutoff = now - limit
            for tq in self.queues([tier]):
                head = tq.items[0]
                if head[0] > cutoff:
                    continue
                running, share, fraction = standing(tier, tq.tenant)
                if head[0] <= now - limit * overdue_after and (
                    overdue is None or head[:2] < overdue[:2]
                ):
                    overdue = head
                if running < share or running == 0:
                    aged = bisect_right(tq.items, cutoff, key=lambda e: e[0])
                    room = share - running
                    keep = 1.0 - fraction
                    streams.append(_within(tq.items, aged, room, keep, lifted, running == 0))
                elif gangs_at_limit and tq.gangs and tq.gangs[0][0] <= cutoff:
                    aged = bisect_right(tq.gangs, cutoff, key=lambda e: e[0])
                    streams.append(_marked(tq.gangs[:aged], lifted))
        if overdue is not None and not (overdue_waits and overdue_waits(overdue[2])):
            lifted.add(overdue[1])
            yield overdue[2]
        if streams:
            yield from _merged(streams)
        heaps = self._tenant_heaps(tiers, {}, tenant_key)
        yield from _weighted(heaps, tier_key, tenant_weight, lifted)

    def _fair_level(
        self,
        tiers: list[str],
        now: float,
        age_limit: Callable[[str], float],
        tier_key: Callable[[str, float], tuple[int, float]],
        tenant_key: Callable[[str, str], float],
        tenant_weight: Callable[[str], float],
    ) -> Iterator[Any]:
        """Every aged job first, oldest first; then weighted fair share over the rest."""
        aged: list[Iterator[tuple[float, int, Any]]] = []
        first_young: dict[int, int] = {}
        for tier in tiers:
            cutoff = now - age_limit(tier)
            for tq in self.queues([tier]):
                if tq.items[0][0] <= cutoff:
                    i = bisect_right(tq.items, cutoff, key=lambda e: e[0])
                    first_young[id(tq)] = i
                    aged.append(islice(tq.items, i))
        if aged:
            yield from _merged(aged)
        # Built only now: the jobs yielded so far may have started and changed the usage.
        heaps = self._tenant_heaps(tiers, first_young, tenant_key)
        yield from _weighted(heaps, tier_key, tenant_weight)

    def _tenant_heaps(
        self,
        tiers: list[str],
        first_young: dict[int, int],
        tenant_key: Callable[[str, str], float],
    ) -> dict[str, list[list[Any]]]:
        """Per tier, a heap of its tenants' queues by usage: [tenant key, tie, queue, next]."""
        heaps: dict[str, list[list[Any]]] = {}
        tie = 0
        for tier in tiers:
            heap: list[list[Any]] = []
            for tq in self.queues([tier]):
                i = first_young.get(id(tq), 0)
                if i < len(tq.items):
                    tie += 1
                    heap.append([tenant_key(tier, tq.tenant), tie, tq, i])
            if heap:
                heapq.heapify(heap)
                heaps[tier] = heap
        return heaps


def _weighted(
    heaps: dict[str, list[list[Any]]],
    tier_key: Callable[[str, float], tuple[int, float]],
    tenant_weight: Callable[[str], float],
    skip: set[int] | None = None,
) -> Iterator[Any]:
    """Weighted fair share over what is left: the tier with the lowest key, inside it the
    tenant with the lowest key; each job yielded is charged to both. Jobs whose seq is in
    `skip` (yielded already) are passed over."""
    charged = dict.fromkeys(heaps, 0.0)
    while heaps:
        tier = min(heaps, key=lambda t: tier_key(t, charged[t]))
        heap = heaps[tier]
        entry = heap[0]
        _, _, tq, i = entry
        job = tq.items[i][2]
        if not skip or tq.items[i][1] not in skip:
            yield job
            gpus = job.gpus * job.nodes
            charged[tier] += gpus
            entry[0] += gpus / tenant_weight(tq.tenant)
        entry[3] = i + 1
        if entry[3] < len(tq.items):
            heapq.heapreplace(heap, entry)
        else:
            heapq.heappop(heap)
            if not heap:
                del heaps[tier]


def _within(
    items: list[tuple[float, int, Any]],
    stop: int,
    room: float,
    keep: float,
    lifted: set[int],
    first_fits: bool = False,
) -> Iterator[tuple[float, int, Any]]:
    """`items[:stop]` in order while they fit in `room` GPUs, a job of g GPUs taking g x `keep`
    of it (the rest of g raises the share itself), passing over those in `lifted`; with
    `first_fits` (a tenant holding nothing) the first always fits. The seqs given go into
    `lifted` (as they are given: a lazy merge asks for the next once it handed on the last)."""
    for entry in islice(items, stop):
        if entry[1] in lifted:
            continue
        job = entry[2]
        room -= job.gpus * job.nodes * keep
        if room < 0 and not first_fits:
            return
        first_fits = False
        lifted.add(entry[1])
        yield entry


def _marked(
    items: Iterable[tuple[float, int, Any]], lifted: set[int]
) -> Iterator[tuple[float, int, Any]]:
    for entry in items:
        if entry[1] not in lifted:
            lifted.add(entry[1])
            yield entry


def _merged(lists: Sequence[Iterable[tuple[float, int, Any]]]) -> Iterator[Any]:
    if len(lists) == 1:
        for entry in lists[0]:
            yield entry[2]
        return
    for entry in heapq.merge(*lists, key=lambda e: (e[0], e[1])):
        yield entry[2]


class SlurmPriority:
    """Our rendering of Slurm's multifactor priority (slurm.conf PriorityType=priority/multifactor).

    priority = W_qos * qos/max_qos + W_fs * 2^(-U/S) + W_age * min(1, age/max_age), where U is the
    tenant's decayed usage as a share of all decayed usage and S its normalised share (weights).
    Like Slurm, priorities are recomputed every `calc_period_s` (PriorityCalcPeriod, 5 min); a job
    that arrives in between is slotted in with its priority at arrival.
    """

    def __init__(self, calc_period_s: float = 300.0) -> None:
        self.calc_period_s = calc_period_s
        self.order: list[tuple[float, float, int, Any]] = []
        self.calc_at = -INF
        self.stale = True

    def invalidate(self) -> None:
        self.stale = True

    def ordered(
        self, now: float, queued: Callable[[], Iterator[Any]], priority: Callable[[Any], float]
    ) -> list[tuple[float, float, int, Any]]:
        if self.stale or now - self.calc_at >= self.calc_period_s:
            self.order = sorted((-priority(j), j.submit, j.seq, j) for j in queued())
            self.calc_at = now
            self.stale = False
        return self.order

    def add(self, job: Any, priority: float) -> None:
        if not self.stale:
            insort(self.order, (-priority, job.submit, job.seq, job), key=lambda e: e[:3])
