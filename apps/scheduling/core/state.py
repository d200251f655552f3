"""Per-node free capacity and the per-pool indexes that find a fitting node without a scan.

A *pool* is the set of nodes that look the same to the static filters (GPU model, GPU count,
taints), so model and taint checks run once per pool, not once per node. Labels vary too much
(a rack label per rack) to split pools by; a pool indexes its nodes by label instead, so a node
selector costs a set intersection.
Inside a pool, each schedulable node sits in exactly one bucket of each index:

- `full[c]`: nodes with exactly `c` fully free healthy GPUs (whole-GPU and CPU-only pods);
- `share[v]`: nodes whose roomiest healthy GPU has `v` thousandths free (GPU shares);
- `classes[(shape, cpu_free)]`: nodes with the same sorted free-GPU vector and free CPU, for
  strategies that score the whole free vector (FGD); kept only when the strategy asks.

Buckets are lists sorted by the strategy's order key then node name, so the first entry of a
bucket that passes the CPU and memory check is that bucket's best node.
"""

from __future__ import annotations

from bisect import bisect_left, insort
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from .model import MILLI, Assignment, Node, Taint

Entry = tuple[Any, ...]  # (*order_key, node name)


@dataclass
class NodeState:
    """A node and what is left on it. `free[i]` counts thousandths; unhealthy GPUs hold 0 usable."""

    node: Node
    pool: Pool
    free: list[int]
    healthy: list[bool]
    cpu_free: int
    mem_free: int
    pods: dict[str, Assignment] = field(default_factory=dict)
    cordoned: bool = False
    # Where the node sits in its pool's indexes, so removal is a bisect, not a search.
    entry: Entry | None = None
    full_key: int = -1
    share_key: int = -1
    class_key: tuple[Any, ...] | None = None

    @classmethod
    def fresh(cls, node: Node, pool: Pool) -> NodeState:
        return cls(
            node, pool, [MILLI] * node.gpus, [True] * node.gpus, node.cpu_milli, node.memory_mib
        )

    @property
    def name(self) -> str:
        return self.node.name

    def usable(self) -> list[int]:
        """Free thousandths per GPU index, 0 for an unhealthy GPU. O(G)."""
        return [f if ok else 0 for f, ok in zip(self.free, self.healthy, strict=True)]

    def full_count(self) -> int:
        return sum(1 for f, ok in zip(self.free, self.healthy, strict=True) if ok and f == MILLI)

    def max_free(self) -> int:
        return max(self.usable(), default=0)

    def total_free(self) -> int:
        return sum(self.usable())

    def shape(self) -> tuple[int, ...]:
        """The usable free vector sorted high to low: what FGD scores. O(G log G)."""
        return tuple(sorted(self.usable(), reverse=True))

    def fits_host(self, cpu_milli: int, memory_mib: int) -> bool:
        return self.cpu_free >= cpu_milli and self.mem_free >= memory_mib

    def gpus_with(self, milli: int) -> list[int]:
        """Indices of usable GPUs with at least `milli` free, lowest index first. O(G)."""
        return [i for i, f in enumerate(self.free) if self.healthy[i] and f >= milli]

    def allocated_milli(self) -> int:
        return MILLI * self.node.gpus - sum(self.free)


class Pool:
    """Nodes that share every static attribute, with their free-capacity buckets."""

    def __init__(self, key: tuple[Any, ...], node: Node, keep_classes: bool) -> None:
        self.key = key
        self.gpu_model = node.gpu_model
        self.gpus = node.gpus
        self.taints = [Taint.parse(t) for t in node.taints]
        self.members: set[str] = set()
        self.by_label: dict[tuple[str, str], set[str]] = {}
        self.full: list[list[Entry]] = [[] for _ in range(node.gpus + 1)]
        self.share: dict[int, list[Entry]] = {}
        self.share_keys: list[int] = []  # sorted keys of `share` with a non-empty bucket
        self.keep_classes = keep_classes
        self.classes: dict[tuple[Any, ...], list[str]] = {}

    @staticmethod
    def key_of(node: Node) -> tuple[Any, ...]:
        return (node.gpu_model, node.gpus, tuple(sorted(node.taints)))

    def add_member(self, node: Node) -> None:
        self.members.add(node.name)
        for item in node.labels.items():
            self.by_label.setdefault(item, set()).add(node.name)

    def remove_member(self, node: Node) -> None:
        self.members.discard(node.name)
        for item in node.labels.items():
            names = self.by_label[item]
            names.discard(node.name)
            if not names:
                del self.by_label[item]

    def selected(self, selector: dict[str, str]) -> set[str]:
        """Members whose labels match every `key=value` of the selector. O(smallest label set)."""
        sets = sorted((self.by_label.get(item, _EMPTY) for item in selector.items()), key=len)
        return sets[0].intersection(*sets[1:]) if sets else set(self.members)

    # -- index maintenance: each O(log n + b) where b is the bucket's length (list memmove) --

    def index(self, st: NodeState, order_key: Callable[[NodeState], tuple[Any, ...]]) -> None:
        """Put a schedulable node into its buckets under its current free capacity."""
        st.entry = (*order_key(st), st.name)
        st.full_key = st.full_count()
        st.share_key = st.max_free()
        insort(self.full[st.full_key], st.entry)
        bucket = self.share.get(st.share_key)
        if bucket is None:
            bucket = self.share[st.share_key] = []
            insort(self.share_keys, st.share_key)
        insort(bucket, st.entry)
        if self.keep_classes:
            st.class_key = (st.shape(), st.cpu_free)
            insort(self.classes.setdefault(st.class_key, []), st.name)

    def unindex(self, st: NodeState) -> None:
        """Take a node out of every bucket (before its capacity changes, or when cordoned)."""
        if st.entry is None:
            return
        _remove(self.full[st.full_key], st.entry)
        bucket = self.share[st.share_key]
        _remove(bucket, st.entry)
        if not bucket:
            del self.share[st.share_key]
            self.share_keys.pop(bisect_left(self.share_keys, st.share_key))
        if st.class_key is not None:
            names = self.classes[st.class_key]
            _remove(names, st.name)
            if not names:
                del self.classes[st.class_key]
        st.entry, st.full_key, st.share_key, st.class_key = None, -1, -1, None

    # -- candidate buckets for one gang member, O(#buckets) --

    def buckets_for(self, gpus: int, gpu_milli: int) -> Iterator[list[Entry]]:
        """The buckets whose nodes have room on their GPUs for `gpus` x `gpu_milli`."""
        if gpus == 0:
            yield from self.full
        elif gpu_milli == MILLI:
            yield from self.full[gpus:]
        else:
            start = bisect_left(self.share_keys, gpu_milli)
            for v in self.share_keys[start:]:
                yield self.share[v]


_EMPTY: set[str] = set()


def _remove(bucket: list[Any], item: object) -> None:
    i = bisect_left(bucket, item)
    if i == len(bucket) or bucket[i] != item:
        raise AssertionError(f"index out of step: {item!r} missing")
    del bucket[i]
