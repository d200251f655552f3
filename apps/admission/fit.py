"""Refuse at submit what no node could ever run (API.md "Honest waiting"), as Slurm does.

A job could run if some node *shape* fits one of its members: a node of its SKU (any SKU when it
names none) whose labels match its selector and that has at least `gpus` GPUs. The shapes are
the nodes that are ready, cordoned or draining (they may take work again), and the pools an
autoscale policy may add (`gpus_per_node`, its labels). Lost nodes count too: a lost node is
usually an agent restarting, and refusing every submit while it restarts would be a false "never"
(a choice beyond the contract, which names ready, cordoned, draining and autoscalable). Gangs are
checked per member: `nodes` x `gpus` fits if one shape has `gpus`; whether enough such nodes
exist is the queue's business (nodes are added and come back).

When no node of any kind is known (a fresh install, agents not registered yet), nothing is
refused: the platform cannot tell "never" from "not yet". A job only draining or cordoned nodes
could fit is accepted; its reason says so (`only_unready`, used by the dispatcher's words).

The shapes are kept per process: the nodes' (one statement) for FIT_SECONDS, and while no node is
known, the autoscaled pools' too, both together for EMPTY_SECONDS (a fresh install's first node
should count soon). So a submit usually reads nothing here (its SQL is bounded:
tests/admission/test_submit_queries.py). A refusal is always decided on a fresh read of both, so a
node registered a moment ago is never refused against; a node gone may still count for
FIT_SECONDS, and a submit in the first EMPTY_SECONDS after the first node registers may be
accepted where none fits (it waits, with the dispatcher's reason). The autoscale pools come from
the scheduling app, above this one: it registers their reader at startup (`pools_from`).
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from django.db import connection
from rest_framework.exceptions import ValidationError

from apps.nodes.models import Gpu, GpuHealth, GpuSku, Node, NodeState

FIT_SECONDS = 10.0
EMPTY_SECONDS = 2.0  # how long "no node known" (and the pools read instead) is kept
AUTOSCALED = "autoscalable"


@dataclass(frozen=True, slots=True)
class Shape:
    sku: str
    gpus: int
    state: str  # a NodeState value, or AUTOSCALED
    labels: Mapping[str, str] = field(default_factory=dict)
    healthy: int = 0  # of a node: its healthy GPUs

    def matches(self, selector: Mapping[str, str]) -> bool:
        return all(self.labels.get(key) == value for key, value in selector.items())


_pools: list[Callable[[], list[Shape]]] = []


def pools_from(reader: Callable[[], list[Shape]]) -> None:
    """Register a reader of the shapes nodes may be added in (the autoscaler's pools)."""
    if reader not in _pools:
        _pools.append(reader)


class _Cache:
    shapes: list[Shape] | None = None
    loaded_at = 0.0
    pools: list[Shape] | None = None  # read only while no node is known
    lock = threading.Lock()


def shapes(fresh: bool = False) -> list[Shape]:
    """The nodes' shapes, kept for FIT_SECONDS (EMPTY_SECONDS while there are none)."""
    with _Cache.lock:
        found = _Cache.shapes
        kept_for = FIT_SECONDS if found else EMPTY_SECONDS
        if found is None or fresh or time.monotonic() - _Cache.loaded_at > kept_for:
            found = _Cache.shapes = _load()
            _Cache.loaded_at = time.monotonic()
            _Cache.pools = None
        return found


def _kept_pools() -> list[Shape]:
    """The autoscaled pools' shapes, kept as long as the (empty) nodes' shapes they stand for."""
    with _Cache.lock:
        if _Cache.pools is None:
            _Cache.pools = with_pools([])
        return _Cache.pools


def forget() -> None:
    """Read the shapes afresh on the next check (tests; a node registered)."""
    with _Cache.lock:
        _Cache.shapes = _Cache.pools = None


def _load() -> list[Shape]:
    """One statement: every node not terminated, with its SKU, labels and GPU counts."""
    node, gpu, sku = Node._meta.db_table, Gpu._meta.db_table, GpuSku._meta.db_table
    with connection.cursor() as cursor:
        cursor.execute(
            f"SELECT s.name, n.state, n.labels, COUNT(g.id), "
            f"COALESCE(SUM(CASE WHEN g.health = %s THEN 1 ELSE 0 END), 0) "
            f"FROM {node} n JOIN {sku} s ON s.id = n.sku_id LEFT JOIN {gpu} g ON g.node_id = n.id "
            f"WHERE n.state <> %s GROUP BY n.id, s.name, n.state, n.labels",
            [GpuHealth.HEALTHY.value, NodeState.TERMINATED.value],
        )
        rows = cursor.fetchall()
    return [
        Shape(name, int(count), state, _labels(labels), int(healthy))
        for name, state, labels, count, healthy in rows
    ]


def with_pools(known: list[Shape]) -> list[Shape]:
    """`known` and the shapes autoscaled pools may add (a statement: read only to refuse)."""
    found = list(known)
    for reader in _pools:
        found += reader()
    return found


def _labels(raw) -> dict:
    if isinstance(raw, str):
        try:
            raw = json.loads(raw)
        except ValueError:
            return {}
    return dict(raw) if isinstance(raw, dict) else {}


def check(data: Mapping) -> None:
    """Raise a 400 naming the field when no shape could ever run the validated submit `data`."""
    gpus = int(data.get("gpus") or 0)
    sku = data.get("gpu_sku")
    sku_name = getattr(sku, "name", sku) if sku else None
    selector = data.get("node_selector") or {}
    known = shapes() or _kept_pools()
    problem = why_never(known, gpus=gpus, sku=sku_name, selector=selector)
    if problem is not None:
        # Only a fresh read refuses: the kept shapes may miss a node registered since.
        known = with_pools(shapes(fresh=True))
        problem = why_never(known, gpus=gpus, sku=sku_name, selector=selector)
    if problem is not None:
        raise ValidationError({problem[0]: [problem[1]]})


def why_never(
    known: list[Shape], *, gpus: int, sku: str | None, selector: Mapping[str, str]
) -> tuple[str, str] | None:
    """(field, what would fit) when no shape of `known` fits; None when one does or none is known."""
    if not known:
        return None
    of_sku = [s for s in known if sku is None or s.sku == sku]
    if not of_sku:
        skus = ", ".join(sorted({s.sku for s in known}))
        return "gpu_sku", f"no node of {sku} is registered or autoscalable; SKUs with nodes: {skus}"
    matching = [s for s in of_sku if s.matches(selector)]
    if not matching:
        where = f" of {sku}" if sku else ""
        offered = sorted({f"{k}={v}" for s in of_sku for k, v in s.labels.items()})
        labels = ", ".join(offered) if offered else "none"
        return "node_selector", (
            f"no node{where} has labels {_words(selector)}; their labels: {labels}"
        )
    most = max(s.gpus for s in matching)
    if gpus > most:
        where = f" of {sku}" if sku else ""
        chosen = " matching the selector" if selector else ""
        return "gpus", (
            f"{gpus} GPUs per node: no node{where}{chosen} has more than {most} "
            f"(ready, cordoned, draining or autoscalable); ask for at most {most} per node, "
            f"and nodes > 1 for a gang across nodes"
        )
    return None


def only_unready(
    known: list[Shape], *, gpus: int, sku: str | None, selector: Mapping[str, str]
) -> str | None:
    """The states of the nodes that could fit the job, when none of them is ready or
    autoscalable (draining, cordoned or lost only): what its reason should say; else None."""
    fitting = [
        s for s in known if (sku is None or s.sku == sku) and s.matches(selector) and s.gpus >= gpus
    ]
    if not fitting or any(s.state in (NodeState.READY, AUTOSCALED) for s in fitting):
        return None
    states = sorted({s.state for s in fitting})
    return " or ".join(states)


def _words(selector: Mapping[str, str]) -> str:
    return ", ".join(f"{k}={v}" for k, v in sorted(selector.items()))
