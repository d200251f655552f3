"""The cluster model: nodes, the pods placed on them, and the placement decisions.

`ClusterManager` is the one entry point. Every public method takes one process-wide lock
(see docs/placement.md for why a single lock beats finer ones under the GIL), so a decision and
its allocation happen as one step and no GPU is ever handed out twice.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from .frag import RequestType, Workload, node_fragmentation, request_type
from .model import MILLI, Assignment, Node, Placement, Pod, Toleration
from .state import NodeState, Pool
from .strategies import Strategy, make_strategy

# A candidate node: (comparable rank, its state); lower ranks are better.
Found = tuple[tuple[Any, ...], NodeState]

# A node selector matching at most 1/SELECTIVE of a pool is served by ranking its nodes
# directly; a broader one by walking the buckets and skipping the nodes it rules out.
SELECTIVE = 8


@dataclass
class WhyNot:
    """Why a pod does not fit: per constraint, how many nodes it ruled out.

    Each node is counted once, under the first constraint it fails, in the order
    cordoned, GPU model, node selector, taint, GPU count, free GPUs or share, CPU, memory.
    """

    fits: int  # nodes that could host one member of the pod now
    needed: int  # members (nodes) the pod asks for
    excluded: dict[str, int] = field(default_factory=dict)  # reason code -> nodes
    reasons: list[str] = field(default_factory=list)  # the same, in words

    @property
    def placeable(self) -> bool:
        return self.fits >= self.needed

    @property
    def message(self) -> str:
        if self.placeable:
            return f"fits: {self.fits} node{'s' * (self.fits != 1)} can host it"
        parts = list(self.reasons)
        if parts:
            count, _, rest = parts[0].partition(" ")
            parts[0] = f"{count} node{'s' * (count != '1')} {rest}"
        if self.needed > 1:
            parts.append(f"gang needs {self.needed} nodes, {self.fits} fit")
        return ", ".join(parts) or "no nodes"

    def __str__(self) -> str:
        return self.message


@dataclass(frozen=True)
class NodeView:
    """A read-only snapshot of one node's free capacity."""

    node: Node
    free_milli: list[int]
    healthy: list[bool]
    cpu_free: int
    memory_free: int
    cordoned: bool
    pods: list[str]


class ClusterManager:
    """Cluster state with free-capacity indexes, and the placement of pods on it.

    `strategy` is a name from `strategies.STRATEGIES` ("first-fit", "best-fit", "spread",
    "bin-pack", "fgd", "fgd-plus"; default "fgd-plus") or a `Strategy` instance.
    Notation in complexities: N nodes, P pools (distinct static node shapes), B index buckets
    scanned (at most G+1 per pool for whole GPUs, G GPUs per node), C node classes (FGD only),
    k gang size, T workload request types.
    """

    def __init__(self, strategy: str | Strategy | None = None) -> None:
        self.strategy = make_strategy(strategy)
        self._lock = threading.RLock()
        self._nodes: dict[str, NodeState] = {}
        self._pools: dict[tuple[Any, ...], Pool] = {}
        self._pods: dict[str, tuple[Pod, Placement]] = {}
        self._eligible: dict[tuple[Any, ...], tuple[list[Pool], list[Pool]]] = {}
        self._seen: Counter[RequestType] = (
            Counter()
        )  # request type -> pods seen (for fragmentation)
        self._seen_names: set[str] = set()  # a pod retried every pass counts once

    # ------------------------------------------------------------------ nodes

    def add_node(self, node: Node) -> None:
        """Add an empty node. Raises ValueError if the name is taken.

        Time O(L + G + log N) (L labels; bucket inserts are bisections plus a list memmove),
        space O(G + L).
        """
        with self._lock:
            if node.name in self._nodes:
                raise ValueError(f"node {node.name} already exists")
            key = Pool.key_of(node)
            pool = self._pools.get(key)
            if pool is None:
                pool = self._pools[key] = Pool(key, node, self.strategy.uses_classes)
                self._eligible.clear()
            st = self._nodes[node.name] = NodeState.fresh(node, pool)
            pool.add_member(node)
            pool.index(st, self.strategy.order_key)

    def remove_node(self, name: str) -> list[Pod]:
        """Remove a node and evict every pod with a part on it, gangs whole; return them.

        Time O(E x k x (G + log N)) for E evicted pods of up to k nodes each, space O(E).
        Raises KeyError for an unknown node.
        """
        with self._lock:
            st = self._nodes[name]
            evicted = [self._pods[p][0] for p in sorted(st.pods)]
            for pod in evicted:
                self._release(pod.name)
            st.pool.unindex(st)
            st.pool.remove_member(st.node)
            if not st.pool.members:
                del self._pools[st.pool.key]
                self._eligible.clear()
            del self._nodes[name]
            return evicted

    def cordon(self, name: str, cordoned: bool = True) -> None:
        """Stop (or resume) placing new pods on a node; its pods stay. Time O(G + log N), space O(1)."""
        with self._lock:
            st = self._nodes[name]
            if st.cordoned != cordoned:
                st.cordoned = cordoned
                self._reindex(st, lambda: None)

    def uncordon(self, name: str) -> None:
        """Place new pods on the node again. Time O(G + log N), space O(1)."""
        self.cordon(name, False)

    def set_gpu_health(self, name: str, index: int, healthy: bool) -> None:
        """Mark one GPU usable or not. Pods already on it stay (evict them with `remove_pod`);
        nothing new lands on an unhealthy GPU. Time O(G + log N), space O(1)."""
        with self._lock:
            st = self._nodes[name]
            if not 0 <= index < st.node.gpus:
                raise ValueError(f"node {name} has no GPU {index}")

            def change() -> None:
                st.healthy[index] = healthy

            self._reindex(st, change)

    def list_nodes(self) -> list[Node]:
        """Every node, sorted by name. Time O(N log N), space O(N)."""
        with self._lock:
            return [self._nodes[n].node for n in sorted(self._nodes)]

    def node_view(self, name: str) -> NodeView:
        """A snapshot of one node's free capacity and pods. Time and space O(G + pods on it)."""
        with self._lock:
            st = self._nodes[name]
            return NodeView(
                st.node,
                list(st.free),
                list(st.healthy),
                st.cpu_free,
                st.mem_free,
                st.cordoned,
                sorted(st.pods),
            )

    # ------------------------------------------------------------------ pods

    def schedule_pod(self, pod: Pod) -> Placement | None:
        """Find room for a pod and allocate it in one step; None (and no change) if none fits.

        Single node, indexed strategies: time O(P x B x (1 + s) + G + log N), where B is the
        number of feasible buckets per pool (at most G+1 for whole GPUs, the distinct roomiest
        free values for shares) and s the nodes skipped in a bucket for lack of CPU or memory
        or for a broad node selector; it never looks at every node. Class strategies (FGD):
        O(P x C) with C the classes of identical nodes (cached scores; a miss costs
        O(V x T x G)). A selective node selector: O(M x G) over its M matching nodes.
        Gang: O(F log F) over the F nodes that could host a member.
        Space O(1) extra for one node, O(F) for a gang.
        """
        with self._lock:
            if pod.name in self._pods:
                raise ValueError(f"pod {pod.name} is already placed")
            self._observe(pod)
            preferred, tolerated = self._pools_for(pod)
            if pod.nodes == 1:
                st = self._best_node(pod, preferred) or self._best_node(pod, tolerated)
                chosen = [st] if st else None
            else:
                chosen = self._pick_gang(pod, preferred)
                if not chosen and tolerated:
                    chosen = self._pick_gang(pod, preferred + tolerated)
            if not chosen:
                return None
            placement = Placement(
                [
                    Assignment(s.name, self.strategy.pick_gpus(s, pod), [pod.gpu_milli] * pod.gpus)
                    for s in chosen
                ]
            )
            self._commit(pod, placement)
            return _copy(placement)

    def add_pod(self, pod: Pod, placement: Placement) -> None:
        """Record an allocation decided earlier (restored from the database).

        Checks only resources, not model, selector or taints (those may have changed since);
        cordoned nodes and unhealthy GPUs are allowed, as the pod is already there. Raises
        ValueError and changes nothing if a resource is not free or the placement does not
        match the pod. Time O(k x (G + log N)), space O(k x G).
        """
        with self._lock:
            self._check_restorable(pod, placement)
            self._observe(pod)
            self._commit(pod, _copy(placement))

    def add_pods(self, pods: Iterable[tuple[Pod, Placement]]) -> None:
        """`add_pod` for many pods, each node re-indexed once at the end instead of once per pod
        (a dispatcher restoring 8,000 allocations on 1,000 nodes). Pods are checked and recorded
        in order; on a ValueError the pods before the failing one stay recorded. The placements
        are kept as given, not copied: the caller hands them over and must not change them.
        Time O(P x k x G + touched nodes x (G + log N))."""
        with self._lock:
            out: dict[str, NodeState] = {}
            try:
                for pod, placement in pods:
                    self._check_restorable(pod, placement)
                    self._observe(pod)
                    for a in placement.assignments:
                        st = self._nodes[a.node]
                        if a.node not in out:
                            st.pool.unindex(st)
                            out[a.node] = st
                        for i, m in zip(a.gpu_indices, a.gpu_milli, strict=True):
                            st.free[i] -= m
                        st.cpu_free -= pod.cpu_milli
                        st.mem_free -= pod.memory_mib
                        st.pods[pod.name] = a
                    self._pods[pod.name] = (pod, placement)
            finally:
                for st in out.values():
                    if not st.cordoned:
                        st.pool.index(st, self.strategy.order_key)

    def remove_pod(self, name: str) -> Placement | None:
        """Free a pod's resources; return its placement, or None if it was not placed (idempotent).

        Time O(k x (G + log N)), space O(k x G) for the returned copy.
        """
        with self._lock:
            if name not in self._pods:
                return None
            return _copy(self._release(name))

    def list_pods(self) -> list[Pod]:
        """Every placed pod, sorted by name. Time O(n log n), space O(n)."""
        with self._lock:
            return [self._pods[n][0] for n in sorted(self._pods)]

    def placement_of(self, name: str) -> Placement | None:
        """Where a pod is (a copy), or None. Time and space O(k x G)."""
        with self._lock:
            entry = self._pods.get(name)
            return _copy(entry[1]) if entry else None

    # ------------------------------------------------------------------ reports

    def utilization(self) -> dict[Any, Any]:
        """Allocated GPU share overall and per model, and fragmentation.

        Time O(N x T x G), space O(models + T).

        `fragmentation`: the share of free GPU capacity that the workload seen so far could not
        use (FGD's measure, see frag.py; before any pod is seen, the workload is one whole GPU).
        Unhealthy GPUs count as capacity; their free part is not free.
        """
        with self._lock:
            workload = Workload.from_counts(self._seen)
            total = used = free = 0
            frag = 0.0
            per_model: dict[str, list[int]] = {}
            for st in self._nodes.values():
                cap = MILLI * st.node.gpus
                alloc = st.allocated_milli()
                total += cap
                used += alloc
                model = per_model.setdefault(st.node.gpu_model, [0, 0])
                model[0] += alloc
                model[1] += cap
                shape = st.shape()
                free += sum(shape)
                frag += node_fragmentation(shape, st.cpu_free, st.node.gpu_model, workload)
            return {
                "gpu": used / total if total else 0.0,
                "by_model": {m: (a / c if c else 0.0) for m, (a, c) in sorted(per_model.items())},
                "fragmentation": frag / free if free else 0.0,
            }

    def why_not(self, pod: Pod) -> WhyNot:
        """Explain where a pod could go and what ruled out the other nodes.

        Time O(N x (G + S)) for S selector items and taints, space O(reasons).
        """
        with self._lock:
            counts: Counter[str | None] = Counter()
            for st in self._nodes.values():
                counts[self._first_failure(st, pod)] += 1
            fits = counts.pop(None, 0)
            order = list(_REASONS)
            excluded = {code: counts[code] for code in order if counts[code]}
            reasons = [f"{n} {_REASONS[code](pod)}" for code, n in excluded.items()]
            return WhyNot(fits, pod.nodes, excluded, reasons)

    def verify(self) -> None:
        """Recompute free capacity and every index from scratch; AssertionError on any drift.

        For tests. O(N x G + pods).
        """
        with self._lock:
            _verify(self)

    # ------------------------------------------------------------------ internals

    def _observe(self, pod: Pod) -> None:
        if pod.name in self._seen_names:
            return
        if len(self._seen_names) >= 100_000:
            self._seen_names.clear()
        self._seen_names.add(pod.name)
        self._seen[request_type(pod)] += 1
        self.strategy.observe(pod)

    def _pools_for(self, pod: Pod) -> tuple[list[Pool], list[Pool]]:
        """Pools passing the static filters: (untainted or tolerated, PreferNoSchedule only)."""
        key = (pod.gpus, pod.gpu_models, pod.tolerations)
        hit = self._eligible.get(key)
        if hit is None:
            preferred, tolerated = [], []
            for pool in self._pools.values():
                verdict = _static_verdict(pool, pod)
                if verdict == "ok":
                    preferred.append(pool)
                elif verdict == "prefer-not":
                    tolerated.append(pool)
            hit = self._eligible[key] = (preferred, tolerated)
        return hit

    def _best_node(self, pod: Pod, pools: list[Pool]) -> NodeState | None:
        """The strategy's best node for one member, over the pools' buckets (or classes)."""
        best: Found | None = None  # (comparable key, node state)
        for pool in pools:
            allowed = pool.selected(pod.node_selector) if pod.node_selector else None
            if allowed is not None and len(allowed) * SELECTIVE <= len(pool.members):
                found = self._best_of(pod, [self._nodes[n] for n in allowed])
            elif self.strategy.uses_classes:
                found = self._best_by_class(pod, pool, allowed, best)
            else:
                found = self._best_in_buckets(pod, pool, allowed, best)
            if found is not None and (best is None or found[0] < best[0]):
                best = found
        return best[1] if best is not None else None

    def _best_in_buckets(
        self, pod: Pod, pool: Pool, allowed: set[str] | None, best: Found | None
    ) -> Found | None:
        """First fitting node of each feasible bucket; buckets are sorted, so stop early."""
        nodes, cpu, mem = self._nodes, pod.cpu_milli, pod.memory_mib
        multi_share = pod.gpus > 1 and pod.gpu_milli < MILLI
        bound = best[0] if best is not None else None
        found: Found | None = None
        for bucket in pool.buckets_for(pod.gpus, pod.gpu_milli):
            for entry in bucket:
                if bound is not None and entry >= bound:
                    break  # nothing later in this bucket beats the best so far
                name = entry[-1]
                st = nodes[name]
                if st.cpu_free < cpu or st.mem_free < mem:
                    continue
                if allowed is not None and name not in allowed:
                    continue
                if multi_share and len(st.gpus_with(pod.gpu_milli)) < pod.gpus:
                    continue
                found, bound = (entry, st), entry
                break
        return found

    def _best_by_class(
        self, pod: Pod, pool: Pool, allowed: set[str] | None, best: Found | None
    ) -> Found | None:
        """FGD-style: score each class of identical nodes once, take its first fitting name."""
        score_of = self.strategy.class_score  # type: ignore[attr-defined]
        bound = best[0] if best is not None else None
        found: Found | None = None
        for (shape, cpu_free), names in pool.classes.items():
            if cpu_free < pod.cpu_milli or not _shape_fits(shape, pod):
                continue
            score = score_of(pool.gpu_model, shape, cpu_free, pod)[0]
            if bound is not None and score > bound[0]:
                continue
            for name in names:
                if bound is not None and (score, name) >= bound:
                    break
                if self._nodes[name].mem_free < pod.memory_mib:
                    continue
                if allowed is not None and name not in allowed:
                    continue
                bound = (score, name)
                found = (bound, self._nodes[name])
                break
        return found

    def _best_of(self, pod: Pod, states: list[NodeState]) -> Found | None:
        """Rank a few given nodes directly (a selective node selector). O(len(states) x G)."""
        best: Found | None = None
        for st in states:
            if st.entry is None or not _fits(st, pod):
                continue
            key = (*self._rank(st, pod), st.name)
            if best is None or key < best[0]:
                best = (key, st)
        return best

    def _member_candidates(self, pod: Pod, pools: list[Pool]) -> list[NodeState]:
        """Every node that could host one gang member, best first by the strategy. O(F log F)."""
        ranked = []
        for pool in pools:
            allowed = pool.selected(pod.node_selector) if pod.node_selector else None
            for bucket in pool.buckets_for(pod.gpus, pod.gpu_milli):
                for entry in bucket:
                    st = self._nodes[entry[-1]]
                    if (allowed is None or st.name in allowed) and _fits(st, pod):
                        ranked.append(((*self._rank(st, pod), st.name), st))
        ranked.sort(key=lambda r: r[0])
        return [st for _, st in ranked]

    def _rank(self, st: NodeState, pod: Pod) -> tuple[Any, ...]:
        """The strategy's rank of a schedulable node for a pod, without the name."""
        if self.strategy.uses_classes:
            return (self.strategy.class_score(st.pool.gpu_model, st.shape(), st.cpu_free, pod)[0],)  # type: ignore[attr-defined]
        return st.entry[:-1]  # type: ignore[index]  # ranked nodes are indexed: entry is set

    def _pick_gang(self, pod: Pod, pools: list[Pool]) -> list[NodeState] | None:
        """k distinct nodes: one rack if any can, else one zone, else the fewest racks."""
        candidates = self._member_candidates(pod, pools)
        if len(candidates) < pod.nodes:
            return None
        return choose_gang(candidates, pod.nodes)

    def _commit(self, pod: Pod, placement: Placement) -> None:
        for a in placement.assignments:
            st = self._nodes[a.node]

            def take(st: NodeState = st, a: Assignment = a) -> None:
                for i, m in zip(a.gpu_indices, a.gpu_milli, strict=True):
                    st.free[i] -= m
                st.cpu_free -= pod.cpu_milli
                st.mem_free -= pod.memory_mib
                st.pods[pod.name] = a

            self._reindex(st, take)
        self._pods[pod.name] = (pod, placement)

    def _release(self, name: str) -> Placement:
        pod, placement = self._pods.pop(name)
        for a in placement.assignments:
            st = self._nodes[a.node]

            def give(st: NodeState = st, a: Assignment = a) -> None:
                for i, m in zip(a.gpu_indices, a.gpu_milli, strict=True):
                    st.free[i] += m
                st.cpu_free += pod.cpu_milli
                st.mem_free += pod.memory_mib
                del st.pods[pod.name]

            self._reindex(st, give)
        return placement

    def _reindex(self, st: NodeState, change: Callable[[], None]) -> None:
        """Apply `change` to a node with it out of the indexes, then put it back if schedulable."""
        st.pool.unindex(st)
        change()
        if not st.cordoned:
            st.pool.index(st, self.strategy.order_key)

    def _check_restorable(self, pod: Pod, placement: Placement) -> None:
        if pod.name in self._pods:
            raise ValueError(f"pod {pod.name} is already placed")
        parts = placement.assignments
        if len(parts) != pod.nodes or len({a.node for a in parts}) != len(parts):
            raise ValueError(
                f"pod {pod.name} wants {pod.nodes} distinct nodes, placement has {placement.nodes}"
            )
        for a in parts:
            st = self._nodes.get(a.node)
            if st is None:
                raise ValueError(f"pod {pod.name}: unknown node {a.node}")
            if len(a.gpu_indices) != pod.gpus or any(m != pod.gpu_milli for m in a.gpu_milli):
                raise ValueError(
                    f"pod {pod.name}: {a} does not match {pod.gpus} x {pod.gpu_milli}m"
                )
            for i, m in zip(a.gpu_indices, a.gpu_milli, strict=True):
                if not 0 <= i < st.node.gpus:
                    raise ValueError(f"pod {pod.name}: node {a.node} has no GPU {i}")
                if st.free[i] < m:
                    raise ValueError(
                        f"pod {pod.name}: GPU {i} on {a.node} has {st.free[i]}m free, needs {m}m"
                    )
            if st.cpu_free < pod.cpu_milli or st.mem_free < pod.memory_mib:
                raise ValueError(f"pod {pod.name}: node {a.node} lacks CPU or memory")

    def _first_failure(self, st: NodeState, pod: Pod) -> str | None:
        if st.cordoned:
            return "cordoned"
        verdict = node_verdict(st, pod)
        if verdict not in ("ok", "prefer-not"):
            return verdict
        if pod.gpus > st.node.gpus:
            return "gpu_count"
        if pod.gpus and len(st.gpus_with(pod.gpu_milli)) < pod.gpus:
            return "gpus" if pod.gpu_milli == MILLI else "gpu_share"
        if st.cpu_free < pod.cpu_milli:
            return "cpu"
        if st.mem_free < pod.memory_mib:
            return "memory"
        return None


def choose_gang(candidates: list[NodeState], k: int) -> list[NodeState]:
    """Pick k of the ranked candidates: within one rack if possible, else one zone, else
    spanning the fewest racks. Among racks (zones) that can hold the gang, the one with the
    fewest candidates wins, keeping big free racks for big gangs. O(F log F)."""
    racks: dict[tuple[Any, ...], list[NodeState]] = {}
    zones: dict[str, list[NodeState]] = {}
    for st in candidates:
        racks.setdefault(_rack_of(st), []).append(st)
        zone = st.node.labels.get("zone")
        if zone is not None:
            zones.setdefault(zone, []).append(st)
    whole = [(len(m), key) for key, m in racks.items() if key[0] == "rack" and len(m) >= k]
    if whole:
        return racks[min(whole)[1]][:k]
    zoned = [(len(m), z) for z, m in zones.items() if len(m) >= k]
    if zoned:
        zone = min(zoned)[1]
        return _fewest_racks([r for r in racks.values() if r[0].node.labels.get("zone") == zone], k)
    return _fewest_racks(list(racks.values()), k)


def _fewest_racks(racks: list[list[NodeState]], k: int) -> list[NodeState]:
    chosen: list[NodeState] = []
    for members in sorted(racks, key=lambda m: (-len(m), m[0].name)):
        chosen += members[: k - len(chosen)]
        if len(chosen) == k:
            break
    return chosen


def _rack_of(st: NodeState) -> tuple[Any, ...]:
    """A node's rack; a node without a `rack` label is a rack of its own."""
    rack = st.node.labels.get("rack")
    if rack is None:
        return ("node", st.name)
    return ("rack", st.node.labels.get("zone", ""), rack)


def _copy(placement: Placement) -> Placement:
    return Placement(
        [Assignment(a.node, list(a.gpu_indices), list(a.gpu_milli)) for a in placement.assignments]
    )


def _shape_fits(shape: tuple[int, ...], pod: Pod) -> bool:
    return pod.gpus == 0 or (len(shape) >= pod.gpus and shape[pod.gpus - 1] >= pod.gpu_milli)


def _fits(st: NodeState, pod: Pod) -> bool:
    if st.cpu_free < pod.cpu_milli or st.mem_free < pod.memory_mib:
        return False
    return pod.gpus == 0 or len(st.gpus_with(pod.gpu_milli)) >= pod.gpus


def node_verdict(st: NodeState, pod: Pod) -> str:
    """The static verdict for one node: its pool's, then the node selector."""
    verdict = _static_verdict(st.pool, pod)
    if verdict in ("gpu_model",):
        return verdict
    if any(st.node.labels.get(k) != v for k, v in pod.node_selector.items()):
        return "selector"
    return verdict


def _static_verdict(pool: Pool, pod: Pod) -> str:
    """'ok', 'prefer-not' (only PreferNoSchedule taints untolerated), or the failing reason."""
    if pod.gpu_models and pool.gpu_model not in pod.gpu_models:
        return "gpu_model"
    tolerations = [Toleration.parse(t) for t in pod.tolerations]
    untolerated = [t for t in pool.taints if not any(tol.tolerates(t) for tol in tolerations)]
    if any(t.effect == "NoSchedule" for t in untolerated):
        return "taint"
    if pod.gpus > pool.gpus:
        return "gpu_count"
    return "prefer-not" if untolerated else "ok"


def _describe_selector(pod: Pod) -> str:
    return ",".join(f"{k}={v}" for k, v in sorted(pod.node_selector.items()))


_REASONS: dict[str, Callable[[Pod], str]] = {
    "cordoned": lambda pod: "cordoned",
    "gpu_model": lambda pod: "lack " + "/".join(pod.gpu_models),
    "selector": lambda pod: f"do not match selector {_describe_selector(pod)}",
    "taint": lambda pod: "tainted",
    "gpu_count": lambda pod: f"have fewer than {pod.gpus} GPUs",
    "gpus": lambda pod: f"lack {pod.gpus} free GPU{'s' * (pod.gpus != 1)}",
    "gpu_share": lambda pod: f"lack {pod.gpus} GPU{'s' * (pod.gpus != 1)} with {pod.gpu_milli}m free",
    "cpu": lambda pod: f"lack {pod.cpu_milli}m CPU",
    "memory": lambda pod: f"lack {pod.memory_mib} MiB memory",
}


def _verify(cm: ClusterManager) -> None:
    taken: dict[str, list[int]] = {n: [0] * st.node.gpus for n, st in cm._nodes.items()}
    cpu: Counter[Any] = Counter()
    mem: Counter[Any] = Counter()
    for name, (pod, placement) in cm._pods.items():
        assert len(placement.assignments) == pod.nodes, name
        for a in placement.assignments:
            assert cm._nodes[a.node].pods.get(name) == a, (name, a.node)
            for i, m in zip(a.gpu_indices, a.gpu_milli, strict=True):
                taken[a.node][i] += m
            cpu[a.node] += pod.cpu_milli
            mem[a.node] += pod.memory_mib
    for name, st in cm._nodes.items():
        assert set(st.pods) <= set(cm._pods), name
        assert all(0 <= t <= MILLI for t in taken[name]), (name, taken[name])
        assert st.free == [MILLI - t for t in taken[name]], (name, st.free, taken[name])
        assert st.cpu_free == st.node.cpu_milli - cpu[name] >= 0, name
        assert st.mem_free == st.node.memory_mib - mem[name] >= 0, name
    for key, pool in cm._pools.items():
        members = {n for n, st in cm._nodes.items() if st.pool is pool}
        assert members == pool.members and members, key
        by_label: dict[tuple[Any, ...], set[Any]] = {}
        for n in members:
            for item in cm._nodes[n].node.labels.items():
                by_label.setdefault(item, set()).add(n)
        assert pool.by_label == by_label, key
        live = [cm._nodes[n] for n in sorted(members) if not cm._nodes[n].cordoned]
        full = [
            sorted((*cm.strategy.order_key(st), st.name) for st in live if st.full_count() == c)
            for c in range(pool.gpus + 1)
        ]
        assert pool.full == full, key
        share: dict[int, list[Any]] = {}
        for st in live:
            share.setdefault(st.max_free(), []).append((*cm.strategy.order_key(st), st.name))
        assert pool.share == {v: sorted(e) for v, e in share.items()}, key
        assert pool.share_keys == sorted(share), key
        if pool.keep_classes:
            classes: dict[tuple[Any, ...], list[str]] = {}
            for st in live:
                classes.setdefault((st.shape(), st.cpu_free), []).append(st.name)
            assert pool.classes == classes, key
    assert set(cm._pools) == {Pool.key_of(st.node) for st in cm._nodes.values()}


def restore(cm: ClusterManager, allocations: Iterable[tuple[Pod, Placement]]) -> list[str]:
    """Re-add known allocations, skipping (and naming) the ones that conflict."""
    conflicts = []
    for pod, placement in allocations:
        try:
            cm.add_pod(pod, placement)
        except ValueError:
            conflicts.append(pod.name)
    return conflicts
