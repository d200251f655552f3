"""The policy's own count of free GPUs per node, and the EASY reservation built on it.

The placement core decides *which* GPUs a pod gets; the policy only needs counts to tell quickly
whether a job could fit at all (so it does not call `schedule_pod` for hopeless candidates) and to
compute when a blocked job will fit (its reservation). Counts come from node capacities and the
running jobs' placements, so they match the cluster as long as every allocation goes through the
policy (the dispatcher builds both from the same rows each tick).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field


class FreeView:
    """Free whole GPUs per node with a histogram per GPU model.

    `hist[model][f]` is the number of nodes of that model with exactly `f` free GPUs, so
    "are there k nodes with >= g free" costs O(max GPUs per node), independent of the node count.
    """

    __slots__ = ("capacity", "free", "model", "hist", "free_total", "total")

    def __init__(self) -> None:
        self.capacity: dict[str, int] = {}
        self.free: dict[str, int] = {}
        self.model: dict[str, str] = {}
        self.hist: dict[str, list[int]] = {}
        self.free_total = 0
        self.total = 0

    def add_node(self, name: str, gpus: int, model: str) -> None:
        """O(G). A node joins with all its GPUs free."""
        if name in self.capacity:
            raise ValueError(f"node {name} already known")
        self.capacity[name] = gpus
        self.free[name] = gpus
        self.model[name] = model
        hist = self.hist.setdefault(model, [0])
        if len(hist) <= gpus:
            hist.extend([0] * (gpus + 1 - len(hist)))
        hist[gpus] += 1
        self.free_total += gpus
        self.total += gpus

    def remove_node(self, name: str) -> None:
        """O(1). Forget a node (its jobs must have been removed by the caller)."""
        free = self.free.pop(name)
        self.hist[self.model[name]][free] -= 1
        self.free_total -= free
        self.total -= self.capacity.pop(name)
        del self.model[name]

    def take(self, node: str, gpus: int) -> None:
        """O(1). `gpus` GPUs of `node` become allocated."""
        self._shift(node, -gpus)

    def give(self, node: str, gpus: int) -> None:
        """O(1). `gpus` GPUs of `node` become free again."""
        self._shift(node, gpus)

    def _shift(self, node: str, delta: int) -> None:
        old = self.free[node]
        new = old + delta
        if new < 0 or new > self.capacity[node]:
            raise ValueError(f"node {node}: free GPUs would be {new} of {self.capacity[node]}")
        hist = self.hist[self.model[node]]
        hist[old] -= 1
        hist[new] += 1
        self.free[node] = new
        self.free_total += delta

    def models_for(self, gpu_models: tuple[str, ...]) -> list[str]:
        if not gpu_models:
            return list(self.hist)
        return [m for m in gpu_models if m in self.hist]

    def nodes_with(self, gpus: int, gpu_models: tuple[str, ...]) -> int:
        """O(models x G): how many nodes of an allowed model have at least `gpus` free."""
        count = 0
        for model in self.models_for(gpu_models):
            hist = self.hist[model]
            if gpus < len(hist):
                count += sum(hist[gpus:]) if gpus > 0 else sum(hist)
        return count

    def fits(self, gpus: int, nodes: int, gpu_models: tuple[str, ...]) -> bool:
        """Necessary condition for placing `nodes` x `gpus` (selectors and taints not checked)."""
        if gpus * nodes > self.free_total:
            return False
        return self.nodes_with(gpus, gpu_models) >= nodes

    def largest_free(self, gpu_models: tuple[str, ...]) -> int:
        best = 0
        for model in self.models_for(gpu_models):
            hist = self.hist[model]
            for f in range(len(hist) - 1, best, -1):
                if hist[f]:
                    best = f
                    break
        return best


@dataclass(slots=True)
class Reservation:
    """The EASY reservation of the first blocked job.

    At `shadow` the job needs `need[node]` GPUs on each reserved node. `released[node]` counts the
    GPUs that running jobs on that node will have released by `shadow` (by their estimates). A job
    that would still run at `shadow` may take at most `extra(node)` GPUs of a reserved node; a job
    that ends by `shadow` may take anything.
    """

    job_id: str
    level: int
    shadow: float
    need: dict[str, int]
    released: dict[str, int] = field(default_factory=dict)
    models: frozenset[str] = frozenset()  # the GPU models of its nodes: the pool it holds

    def holds_for(self, gpu_models: tuple[str, ...]) -> bool:
        """Whether a job of these models could use any of its nodes (it binds that job only)."""
        if not gpu_models:
            return True
        return not self.models.isdisjoint(gpu_models)

    def extra(self, view: FreeView, node: str) -> int:
        return view.free[node] + self.released.get(node, 0) - self.need[node]

    def blocked(self, view: FreeView, node: str) -> int:
        """Free GPUs of a reserved node that a job running past `shadow` must not take."""
        return max(0, min(view.free[node], self.need[node] - self.released.get(node, 0)))

    def respects(self, view: FreeView, alloc: list[tuple[str, int]]) -> bool:
        """Whether a long job holding `alloc` (node, GPUs) leaves the reservation intact.

        Called after the placement was applied to `view`, so `extra` must stay >= 0.
        """
        return all(self.extra(view, node) >= 0 for node, _ in alloc if node in self.need)


def fits_around(
    view: FreeView,
    reservations: list[Reservation],
    gpus: int,
    nodes: int,
    gpu_models: tuple[str, ...],
) -> bool:
    """Like `FreeView.fits`, with the blocked GPUs of these reservations taken out. O(reserved)."""
    if not view.fits(gpus, nodes, gpu_models):
        return False
    allowed = set(view.models_for(gpu_models))
    count = view.nodes_with(gpus, gpu_models)
    for resv in reservations:
        for node in resv.need:
            free = view.free[node]
            if (
                view.model[node] in allowed
                and free >= gpus
                and free - resv.blocked(view, node) < gpus
            ):
                count -= 1
    return count >= nodes


def earliest_fit(
    view: FreeView,
    ends: list[tuple[float, int, str]],
    allocs: Mapping[str, list[tuple[str, int]]],
    gpus: int,
    nodes: int,
    gpu_models: tuple[str, ...],
    now: float,
    exclude: set[str] | frozenset[str] = frozenset(),
) -> tuple[float, dict[str, int]] | None:
    """When `nodes` x `gpus` fits if running jobs end at their estimates, and on which nodes.

    `ends` is the running jobs sorted by estimated end (`(end, seq, job_id)`). Walks it releasing
    GPUs until enough nodes have `gpus` free: O(J x nodes per job) for the J jobs walked, plus
    O(N) once to pick the reserved nodes. Nodes in `exclude` (reserved for others) are not used.
    Returns None if the job can never fit.
    Returns `(shadow, released)` with `released[node]` = GPUs freed on node by `shadow`.
    """
    allowed = set(view.models_for(gpu_models))
    count = view.nodes_with(gpus, gpu_models)
    for node in exclude:
        if view.model.get(node) in allowed and view.free[node] >= gpus:
            count -= 1
    gained: dict[str, int] = {}
    shadow = now
    if count < nodes:
        for end, _, job_id in ends:
            for node, n in allocs[job_id]:
                if node not in view.model or view.model[node] not in allowed or node in exclude:
                    continue
                before = view.free[node] + gained.get(node, 0)
                gained[node] = gained.get(node, 0) + n
                if before < gpus <= before + n:
                    count += 1
            if count >= nodes:
                shadow = max(end, now)
                break
        else:
            return None
    return shadow, gained


def pick_reserved(
    view: FreeView,
    gained: dict[str, int],
    gpus: int,
    nodes: int,
    gpu_models: tuple[str, ...],
    exclude: set[str] | frozenset[str] = frozenset(),
) -> dict[str, int]:
    """The `nodes` nodes that will have `gpus` free at the shadow time, tightest first. O(N log N)."""
    allowed = set(view.models_for(gpu_models))
    fitting = []
    for node, free in view.free.items():
        if view.model[node] not in allowed or node in exclude:
            continue
        at_shadow = free + gained.get(node, 0)
        if at_shadow >= gpus:
            fitting.append((at_shadow, free, node))
    fitting.sort()
    return {node: gpus for _, _, node in fitting[:nodes]}
