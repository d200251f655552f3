"""Placement strategies: how to rank the nodes that fit a pod, and which GPUs to take on one.

Indexed strategies rank nodes by an *order key* computed from the node's free capacity alone
(lower is better, ties broken by the smaller node name). The cluster keeps each index bucket
sorted by that key, so a bucket's first fitting node is its best and a placement looks at one
node per bucket. Class strategies (FGD) score a node by its whole free vector against the pod;
the cluster hands them one representative per class of identical nodes instead.
"""

from __future__ import annotations

import math
from collections import Counter
from typing import Any

from .frag import DEFAULT_WORKLOAD, RequestType, Workload, node_fragmentation, request_type
from .model import MILLI, Pod
from .state import NodeState

RELEARN_EVERY = 4096  # arrivals between re-learnings of the workload mix, once it is settled
CACHE_LIMIT = 200_000  # entries per score cache before it is dropped and rebuilt


class Strategy:
    """The interface the cluster calls. Subclasses override `order_key` and `pick_gpus`."""

    name = "base"
    uses_classes = False

    def order_key(self, st: NodeState) -> tuple[Any, ...]:
        """Rank of a node among those that fit (lower first). Must depend on capacity only."""
        return ()

    def pick_gpus(self, st: NodeState, pod: Pod) -> list[int]:
        """GPU indices on a node known to fit: whole GPUs lowest index first, a share by rank."""
        if pod.gpus == 0:
            return []
        roomy = st.gpus_with(pod.gpu_milli)
        if pod.gpu_milli < MILLI:
            roomy.sort(key=lambda i: self.gpu_rank(st.free[i]))
        return roomy[: pod.gpus]

    def gpu_rank(self, free: int) -> int:
        """Which GPU a share goes to, among those with room: the tightest by default."""
        return free

    def observe(self, pod: Pod) -> None:
        """Hear of an arriving pod (FGD learns the workload mix from these)."""

    def __repr__(self) -> str:
        return f"<strategy {self.name}>"


class FirstFit(Strategy):
    """The first node by name that fits; a share goes to the lowest-index GPU with room."""

    name = "first-fit"

    def gpu_rank(self, free: int) -> int:
        return 0  # stable sort keeps index order


class BestFit(Strategy):
    """The node left with the least free GPU, then CPU, then memory: fill tight spots first."""

    name = "best-fit"

    def order_key(self, st: NodeState) -> tuple[Any, ...]:
        return (st.total_free(), st.cpu_free, st.mem_free)


class BinPack(Strategy):
    """The most allocated node by share of its GPUs (then CPU): consolidate, keep nodes empty."""

    name = "bin-pack"

    def order_key(self, st: NodeState) -> tuple[Any, ...]:
        return (_free_fraction(st), _cpu_fraction(st))


class Spread(Strategy):
    """The least allocated node (share of GPUs, then CPU); a share goes to the emptiest GPU."""

    name = "spread"

    def order_key(self, st: NodeState) -> tuple[Any, ...]:
        return (-_free_fraction(st), -_cpu_fraction(st))

    def gpu_rank(self, free: int) -> int:
        return -free


class FGD(Strategy):
    """Fragmentation gradient descent (Weng et al., ATC '23), as its artifact scores it.

    A node's score is the change in expected fragmentation F (frag.py) the placement causes,
    under the workload mix (given, or learnt from the pods seen). Like the artifact, the change
    is squashed through a sigmoid into an integer 0..100, so many nodes tie and the smaller
    node name wins: that tie-break packs load onto a stable subset of nodes, which the paper's
    numbers rely on.
    """

    name = "fgd"
    uses_classes = True

    def __init__(self, workload: Workload | None = None, *, coverage: float = 0.95) -> None:
        self.fixed = workload is not None
        self.coverage = coverage
        self.workload = workload or DEFAULT_WORKLOAD
        self._seen: Counter[RequestType] = Counter()
        self._seen_count = 0
        self._next_relearn = 1
        self._frag: dict[tuple[Any, ...], float] = {}
        self._score: dict[tuple[Any, ...], tuple[Any, ...]] = {}

    def observe(self, pod: Pod) -> None:
        """Learn the mix: relearn after 1, 2, 4, ... 4096 arrivals, then every 4096."""
        if self.fixed:
            return
        self._seen[request_type(pod)] += 1
        self._seen_count += 1
        seen = self._seen_count
        if seen >= self._next_relearn:
            self._next_relearn = seen * 2 if seen < RELEARN_EVERY else seen + RELEARN_EVERY
            self.set_workload(Workload.from_counts(self._seen, coverage=self.coverage))

    def set_workload(self, workload: Workload) -> None:
        if workload != self.workload:
            self.workload = workload
            self._frag.clear()
            self._score.clear()

    def frag(self, model: str, shape: tuple[int, ...], cpu_free: int) -> float:
        """F of a node state, cached. O(1) on a hit, O(T x G) on a miss."""
        key = (model, shape, cpu_free)
        value = self._frag.get(key)
        if value is None:
            if len(self._frag) > CACHE_LIMIT:
                self._frag.clear()
            value = self._frag[key] = self._node_frag(model, shape, cpu_free)
        return value

    def _node_frag(self, model: str, shape: tuple[int, ...], cpu_free: int) -> float:
        return node_fragmentation(shape, cpu_free, model, self.workload)

    def score(self, before: float, after: float) -> int:
        """The artifact's score, negated so that lower is better: -int(100 sigmoid(-dF/1000))."""
        return -int(100 / (1 + math.exp((after - before) / 1000)))

    def class_score(
        self, model: str, shape: tuple[int, ...], cpu_free: int, pod: Pod
    ) -> tuple[Any, ...]:
        """(score, GPU free values the share may take) for a node class; lower score is better.

        Cached per (class, request): O(1) on a hit, O(V x T x G) on a miss for V distinct
        free values on the node.
        """
        key = (model, shape, cpu_free, pod.gpus, pod.gpu_milli, pod.cpu_milli)
        hit = self._score.get(key)
        if hit is None:
            if len(self._score) > CACHE_LIMIT:
                self._score.clear()
            hit = self._score[key] = self._class_score(model, shape, cpu_free, pod)
        return hit

    def _class_score(
        self, model: str, shape: tuple[int, ...], cpu_free: int, pod: Pod
    ) -> tuple[Any, ...]:
        before = self.frag(model, shape, cpu_free)
        cpu_after = cpu_free - pod.cpu_milli
        if pod.gpus == 1 and pod.gpu_milli < MILLI:
            # A share may go to any GPU with room: score each distinct free value.
            best, values = None, []
            for v in sorted(set(shape)):
                if v < pod.gpu_milli:
                    continue
                after = _take(shape, [v], pod.gpu_milli)
                s = self.score(before, self.frag(model, after, cpu_after))
                if best is None or s < best:
                    best, values = s, [v]
                elif s == best:
                    values.append(v)
            return (best, tuple(values))
        taken = sorted(f for f in shape if f >= pod.gpu_milli)[: pod.gpus]
        after = _take(shape, taken, pod.gpu_milli)
        return (self.score(before, self.frag(model, after, cpu_after)), ())

    def pick_gpus(self, st: NodeState, pod: Pod) -> list[int]:
        if not (pod.gpus == 1 and pod.gpu_milli < MILLI):
            # The artifact's exclusive choice: the least sufficient GPUs, lowest index on ties.
            roomy = st.gpus_with(pod.gpu_milli)
            roomy.sort(key=lambda i: st.free[i])
            return sorted(roomy[: pod.gpus])
        _, values = self.class_score(st.pool.gpu_model, st.shape(), st.cpu_free, pod)
        return [next(i for i in st.gpus_with(pod.gpu_milli) if st.free[i] in values)]


class FGDPlus(FGD):
    """The default: FGD that also counts the GPU a node's CPU can no longer feed.

    F+ = F + cpu_weight x max(0, free GPU thousandths - free CPU / rho), rho being the CPU the
    workload asks per GPU thousandth (its GPU pods' CPU over their GPU): the free GPU that,
    in expectation, will be stranded for lack of CPU. FGD sees CPU only once it is already too
    short for a request type; this term steers CPU-heavy pods (CPU-only ones above all) to
    nodes with CPU to spare, before the GPUs there are cut off. Score = round(dF+ / quantum):
    changes within `quantum` thousandths tie, and the smaller node name wins, which packs.
    """

    name = "fgd-plus"

    def __init__(
        self,
        workload: Workload | None = None,
        *,
        coverage: float = 0.95,
        cpu_weight: float = 1.0,
        quantum: int = 200,
    ) -> None:
        super().__init__(workload, coverage=coverage)
        self.cpu_weight = cpu_weight
        self.quantum = quantum

    def _node_frag(self, model: str, shape: tuple[int, ...], cpu_free: int) -> float:
        frag = node_fragmentation(shape, cpu_free, model, self.workload)
        rho = self.workload.cpu_per_gpu_milli
        if rho and self.cpu_weight:
            frag += self.cpu_weight * max(0.0, sum(shape) - cpu_free / rho)
        return frag

    def score(self, before: float, after: float) -> int:
        return round((after - before) / self.quantum)


def _take(shape: tuple[int, ...], values: list[int], milli: int) -> tuple[int, ...]:
    """`shape` with `milli` taken from one GPU of each free value in `values`."""
    out = list(shape)
    for v in values:
        out[out.index(v)] = v - milli
    return tuple(sorted(out, reverse=True))


def _free_fraction(st: NodeState) -> float:
    return st.total_free() / (MILLI * st.node.gpus) if st.node.gpus else 1.0


def _cpu_fraction(st: NodeState) -> float:
    return st.cpu_free / st.node.cpu_milli if st.node.cpu_milli else 1.0


DEFAULT = FGDPlus.name
STRATEGIES: dict[str, type[Strategy]] = {
    cls.name: cls for cls in (FirstFit, BestFit, BinPack, Spread, FGD, FGDPlus)
}


def make_strategy(strategy: str | Strategy | None) -> Strategy:
    if isinstance(strategy, Strategy):
        return strategy
    name = strategy or DEFAULT
    if name not in STRATEGIES:
        raise ValueError(f"unknown strategy {name!r}; choose one of {sorted(STRATEGIES)}")
    return STRATEGIES[name]()
