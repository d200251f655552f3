"""Backfill and reservations: what a blocked job holds, and what may start around it.

`Reservations` are the holds in force during one pass (EASY backfill: the first blocked job gets
the nodes that free up first; `config.reservations` > 1 gives that many blocked jobs one each, on
disjoint nodes) and the placement of a job that must leave them intact. What the first job of its
standing does when it can neither start nor preempt is a `Backfill` rule from `BACKFILLS`
(`PolicyConfig.backfill` picks `easy` or `off`); a new rule is a new class there.
capacity.py holds the counting underneath (free GPUs per node, the shadow time).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import Protocol

from apps.scheduling.core.model import Node, Placement, Pod, Taint, Toleration
from apps.scheduling.core.policy.capacity import (
    FreeView,
    Reservation,
    earliest_fit,
    fits_around,
    pick_reserved,
)
from apps.scheduling.core.policy.cluster import PolicyCluster
from apps.scheduling.core.policy.model import (
    Decision,
    PolicyConfig,
    QueuedJob,
    Reserve,
    RunningJob,
    TierPolicy,
    alloc_of,
    gpu_label,
    when_label,
)


class BackfillScheduler(Protocol):
    """What reservations read of the scheduler (`Scheduler` satisfies it)."""

    config: PolicyConfig
    tiers: dict[str, TierPolicy]
    queued: dict[str, QueuedJob]
    running: dict[str, RunningJob]
    view: FreeView
    cluster: PolicyCluster
    _held: list[str]
    _resvs: dict[str, Reservation]
    _resv_dirty: bool
    _ends: list[tuple[float, int, str]]

    def _pod(self, job: QueuedJob | RunningJob) -> Pod: ...


class BackfillPass(Protocol):
    """What a backfill rule and the reservations use of the pass (`Pass` satisfies it)."""

    now: float
    explain: bool
    invalid: bool
    out: list[Decision]
    resv: Reservations

    @property
    def s(self) -> BackfillScheduler: ...

    def wait(self, job: QueuedJob, reason: str | Callable[..., str], *args: object) -> None: ...

    def shortage(self, job: QueuedJob) -> str: ...


class Backfill(Protocol):
    name: str

    def blocked(self, p: BackfillPass, job: QueuedJob) -> bool:
        """The first job of its standing neither starts nor preempts. False stops the pass."""
        ...

    def preempted(self, p: BackfillPass, job: QueuedJob) -> bool:
        """The first job of its standing signalled victims; they stop within the grace."""
        ...


class Easy:
    """EASY backfill: the blocked job holds the nodes that free up first; the pass goes on."""

    name = "easy"

    def blocked(self, p: BackfillPass, job: QueuedJob) -> bool:
        return p.resv.make_head(job)

    def preempted(self, p: BackfillPass, job: QueuedJob) -> bool:
        return p.resv.make_head(job, force=True)  # hold the victims' GPUs for it


class Off:
    """No backfill: head-of-line blocking, the pass stops at the first job that cannot start."""

    name = "off"

    def blocked(self, p: BackfillPass, job: QueuedJob) -> bool:
        p.wait(job, p.shortage, job)
        return False

    def preempted(self, p: BackfillPass, job: QueuedJob) -> bool:
        return True


BACKFILLS: dict[str, Callable[[], Backfill]] = {cls.name: cls for cls in (Easy, Off)}


def make_backfill(config: PolicyConfig) -> Backfill:
    return BACKFILLS[Easy.name if config.backfill else Off.name]()


# (GPU models, binding reservations) -> the fewest GPUs per node that failed the count check
FailedShapes = dict[tuple[tuple[str, ...], tuple[str, ...]], int]


class Reservations:
    """The reservations in force during one pass, and placing a job around them.

    `heads` are those kept from earlier passes (sticky) and those made for blocked jobs in this
    one, at most `config.reservations`, on disjoint nodes. A job must leave intact every
    reservation of its level or above but its own.
    """

    def __init__(self, p: BackfillPass) -> None:
        self.p = p
        self.s: BackfillScheduler = p.s
        self.heads: list[Reservation] = []
        self.head_of: dict[str, Reservation] = {}
        # (level, GPU models) -> the heads at or above that level on nodes of those models
        self._binding: dict[tuple[int, tuple[str, ...]], list[Reservation]] = {}
        self.failed: FailedShapes = {}
        self._filtered: dict[
            tuple[object, ...], set[str]
        ] = {}  # (selector, tolerations) -> unusable nodes
        self._all_nodes: list[Node] | None = None

    def load(self) -> None:
        """Keep the reservations of the jobs that held one last pass (renewed when stale)."""
        s = self.s
        fresh = not s._resv_dirty
        if not s.config.sticky_reservations:
            return
        for job_id in s._held:
            job = s.queued.get(job_id)
            if job is None or len(self.in_pool(job)) >= max(1, s.config.reservations):
                continue
            cached = s._resvs.get(job_id)
            if fresh and cached is not None and self.p.now < cached.shadow:
                self.add(cached)
            else:
                resv = self.reserve(job)
                if resv is not None:
                    self.add(resv)

    def add(self, resv: Reservation) -> None:
        self.heads.append(resv)
        self.head_of[resv.job_id] = resv
        self.failed.clear()
        self._binding.clear()

    def drop(self, job_id: str) -> None:
        resv = self.head_of.pop(job_id, None)
        if resv is not None:
            self.heads.remove(resv)
            self.failed.clear()
            self._binding.clear()

    def binding(self, job: QueuedJob, level: int) -> list[Reservation]:
        """The reservations `job` must leave intact: those of its level or above but its own."""
        key = (level, job.gpu_models)
        binding = self._binding.get(key)
        if binding is None:
            binding = self._binding[key] = [
                r for r in self.heads if r.level >= level and r.holds_for(job.gpu_models)
            ]
        if job.job_id in self.head_of:
            binding = [r for r in binding if r.job_id != job.job_id]
        return binding

    def in_pool(self, job: QueuedJob) -> list[Reservation]:
        """The reservations on nodes `job` could use (of any level): a reservation holds its
        own pool only, so a job of another GPU model never waits behind it."""
        return [r for r in self.heads if r.holds_for(job.gpu_models)]

    def reserve(self, job: QueuedJob) -> Reservation | None:
        """The earliest time and nodes for `job`, on nodes no other reservation holds."""
        s = self.s
        # Nodes held by other reservations, and those the job can never use (its selector, a
        # taint it does not tolerate): a head must not hold a node it could not run on.
        taken = {node for r in self.heads for node in r.need} | self._unusable(job)
        found = earliest_fit(
            s.view, s._ends, _Allocs(s), job.gpus, job.nodes, job.gpu_models, self.p.now, taken
        )
        if found is None:
            return None
        shadow, gained = found
        need = pick_reserved(s.view, gained, job.gpus, job.nodes, job.gpu_models, taken)
        released = {node: gained[node] for node in need if node in gained}
        models = frozenset(s.view.model[node] for node in need)
        return Reservation(job.job_id, s.tiers[job.tier].level, shadow, need, released, models)

    def _unusable(self, job: QueuedJob) -> set[str]:
        """Nodes that fail the job's static filters as placement checks them (node selector,
        NoSchedule taints it does not tolerate). O(N) per reservation made, cached per pool."""
        if not job.node_selector and not any(n.taints for n in self._nodes()):
            return set()
        key = (tuple(sorted(job.node_selector.items())), job.tolerations)
        cached = self._filtered.get(key)
        if cached is None:
            tolerations = [Toleration.parse(t) for t in job.tolerations]
            cached = self._filtered[key] = {
                node.name
                for node in self._nodes()
                if any(node.labels.get(k) != v for k, v in job.node_selector.items())
                or any(
                    taint.effect == "NoSchedule"
                    and not any(tol.tolerates(taint) for tol in tolerations)
                    for taint in map(Taint.parse, node.taints)
                )
            }
        return cached

    def _nodes(self) -> list[Node]:
        if self._all_nodes is None:
            self._all_nodes = self.s.cluster.list_nodes()
        return self._all_nodes

    def make_head(self, job: QueuedJob, force: bool = False) -> bool:
        """Give a blocked job a reservation (or renew its own); False never stops the pass."""
        p = self.p
        resv = self.head_of.get(job.job_id)
        if resv is None:
            same_pool = self.in_pool(job)
            if len(same_pool) >= self.s.config.reservations and not force:
                level = self.s.tiers[job.tier].level
                lowest = min(same_pool, key=lambda r: r.level)
                if lowest.level >= level:
                    p.wait(job, p.shortage, job)
                    return True
                self.drop(lowest.job_id)  # a higher level takes the reservation over
                p.invalid = True
            resv = self.reserve(job)
            if resv is None:
                p.wait(
                    job,
                    "needs {} node(s) with {}: more than the cluster can offer",
                    job.nodes,
                    gpu_label(job),
                )
                return True
            self.add(resv)
        reason, shortage = "reserved", ""
        if p.explain:
            shortage = p.shortage(job)
            reason = (
                f"first in line, reserved {len(resv.need)} node(s) from {when_label(resv.shadow)} "
                f"(when running jobs end by their limits); now {shortage}"
            )
        p.out.append(Reserve(job.job_id, tuple(sorted(resv.need)), resv.shadow, reason, shortage))
        return True

    # --- placing around reservations --------------------------------------------------------

    def place(self, job: QueuedJob, binding: list[Reservation]) -> Placement | None:
        """Place via the placement core, leaving the `binding` reservations intact.

        A shape that failed the count check in this pass fails again without a second look
        (cleared whenever a job starts or a reservation changes).
        """
        key = (job.gpu_models, tuple([r.job_id for r in binding]))
        fewest = self.failed.get(key)
        if fewest is not None and job.gpus >= fewest:
            return None
        if not self._may_fit(job, binding):
            if job.nodes == 1:
                self.failed[key] = job.gpus if fewest is None else min(fewest, job.gpus)
            return None
        pod = self.s._pod(job)
        placement = self.s.cluster.schedule_pod(pod)
        if placement is None or not binding:
            return placement
        found = self._steer_clear(pod, placement, binding)
        if found is None and job.nodes == 1:
            self.failed[key] = job.gpus if fewest is None else min(fewest, job.gpus)
        return found

    def _may_fit(self, job: QueuedJob, binding: list[Reservation]) -> bool:
        view = self.s.view
        if binding:
            return fits_around(view, binding, job.gpus, job.nodes, job.gpu_models)
        return view.fits(job.gpus, job.nodes, job.gpu_models)

    def _steer_clear(
        self, pod: Pod, placement: Placement, binding: list[Reservation]
    ) -> Placement | None:
        """The placement core chose GPUs a reservation needs: undo, cordon those nodes for a
        moment, retry (three times at most)."""
        cluster = self.s.cluster
        found: Placement | None = placement
        cordoned: list[str] = []
        for _ in range(3):
            clash = self._clashes(alloc_of(placement), binding)
            if not clash:
                break
            cluster.remove_pod(pod.name)
            for node in clash:
                if not cluster.node_view(node).cordoned:
                    cluster.cordon(node)
                    cordoned.append(node)
            found = cluster.schedule_pod(pod)
            if found is None:
                break
            placement = found
        else:
            cluster.remove_pod(pod.name)
            found = None
        for node in cordoned:
            cluster.cordon(node, False)
        return found

    def _clashes(self, alloc: list[tuple[str, int]], binding: list[Reservation]) -> set[str]:
        """Reserved nodes on which `alloc` would leave a reservation short."""
        view = self.s.view
        for node, n in alloc:
            view.take(node, n)
        clash = {
            node for node, _ in alloc for r in binding if node in r.need and r.extra(view, node) < 0
        }
        for node, n in alloc:
            view.give(node, n)
        return clash


class _Allocs(Mapping[str, list[tuple[str, int]]]):
    """A read-only mapping job_id -> alloc over the running jobs, without building a dict."""

    __slots__ = ("s",)

    def __init__(self, scheduler: BackfillScheduler) -> None:
        self.s = scheduler

    def __getitem__(self, job_id: str) -> list[tuple[str, int]]:
        return self.s.running[job_id].alloc

    def __iter__(self) -> Iterator[str]:
        return iter(self.s.running)

    def __len__(self) -> int:
        return len(self.s.running)
