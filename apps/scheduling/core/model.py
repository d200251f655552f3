"""The plain values the placement core trades in: nodes, pods and placements.

They are validated on construction so that everything behind them can trust them; none of
them imports Django, so the dispatcher, the simulator and the benchmarks share them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

MILLI = 1000  # one whole GPU, in thousandths
EFFECTS = ("NoSchedule", "PreferNoSchedule")


@dataclass(frozen=True)
class Taint:
    """A parsed `key=value:Effect` (or `key:Effect`) node taint."""

    key: str
    value: str | None
    effect: str

    @classmethod
    def parse(cls, text: str) -> Taint:
        body, sep, effect = text.rpartition(":")
        if not sep or effect not in EFFECTS or not body:
            raise ValueError(f"bad taint {text!r}: want 'key=value:Effect', Effect in {EFFECTS}")
        key, eq, value = body.partition("=")
        if not key:
            raise ValueError(f"bad taint {text!r}: empty key")
        return cls(key, value if eq else None, effect)


@dataclass(frozen=True)
class Toleration:
    """A parsed toleration: `*`, `key:Effect`, `key=value:Effect`, or without `:Effect` (any)."""

    key: str | None  # None tolerates every taint ("*")
    value: str | None  # None matches any value of the key
    effect: str | None  # None matches both effects

    @classmethod
    def parse(cls, text: str) -> Toleration:
        if text == "*":
            return cls(None, None, None)
        body, effect = text, None
        head, sep, tail = text.rpartition(":")
        if sep and tail in EFFECTS:
            body, effect = head, tail
        key, eq, value = body.partition("=")
        if not key:
            raise ValueError(f"bad toleration {text!r}")
        return cls(key, value if eq else None, effect)

    def tolerates(self, taint: Taint) -> bool:
        if self.key is None:
            return True
        if self.key != taint.key or (self.effect is not None and self.effect != taint.effect):
            return False
        return self.value is None or self.value == taint.value


@dataclass(frozen=True, eq=False)
class Node:
    """A machine with `gpus` GPUs of one model, CPU in millicores and memory in MiB.

    A capacity of 0 is literal: a node with `cpu_milli=0` hosts only pods that ask for no CPU.
    """

    name: str
    gpus: int
    gpu_model: str
    cpu_milli: int = 0
    memory_mib: int = 0
    labels: dict[str, str] = field(default_factory=dict)
    taints: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if not self.name:
            raise ValueError("a node needs a name")
        _check_non_negative(self, "gpus", "cpu_milli", "memory_mib")
        object.__setattr__(self, "labels", dict(self.labels))
        object.__setattr__(self, "taints", tuple(self.taints))
        for text in self.taints:
            Taint.parse(text)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Node) and _fields(self) == _fields(other)

    def __hash__(self) -> int:
        return hash(self.name)

    def __repr__(self) -> str:
        return f"Node({self.name!r}, {self.gpus}x{self.gpu_model})"


@dataclass(frozen=True, eq=False)
class Pod:
    """A request: `gpus` GPUs per node with `gpu_milli` of each, on `nodes` nodes (a gang).

    `gpu_milli < 1000` is a share of a GPU (each of the `gpus` GPUs gets that share);
    `gpus=0` is a CPU-only pod; `gpu_models` empty means any model.
    """

    name: str
    gpus: int = 1
    gpu_milli: int = MILLI
    cpu_milli: int = 0
    memory_mib: int = 0
    gpu_models: tuple[str, ...] = ()
    node_selector: dict[str, str] = field(default_factory=dict)
    tolerations: tuple[str, ...] = ()
    nodes: int = 1

    def __post_init__(self) -> None:
        if not self.name:
            raise ValueError("a pod needs a name")
        _check_non_negative(self, "gpus", "cpu_milli", "memory_mib")
        if not 1 <= self.gpu_milli <= MILLI:
            raise ValueError(f"pod {self.name}: gpu_milli must be 1..1000, got {self.gpu_milli}")
        if self.nodes < 1:
            raise ValueError(f"pod {self.name}: nodes must be >= 1, got {self.nodes}")
        models = self.gpu_models
        if isinstance(models, str):
            models = (models,)
        object.__setattr__(self, "gpu_models", tuple(dict.fromkeys(models)))
        object.__setattr__(self, "node_selector", dict(self.node_selector))
        object.__setattr__(self, "tolerations", tuple(self.tolerations))
        for text in self.tolerations:
            Toleration.parse(text)

    @property
    def is_share(self) -> bool:
        return self.gpus > 0 and self.gpu_milli < MILLI

    @property
    def gpu_request_milli(self) -> int:
        """GPU thousandths asked for per node."""
        return self.gpus * self.gpu_milli

    def shape(self) -> tuple[int, int, int, int]:
        """What the resource filters look at: (gpus, gpu_milli, cpu_milli, memory_mib)."""
        return (self.gpus, self.gpu_milli, self.cpu_milli, self.memory_mib)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Pod) and _fields(self) == _fields(other)

    def __hash__(self) -> int:
        return hash(self.name)

    def __repr__(self) -> str:
        share = f"x{self.gpu_milli}m" if self.gpu_milli < MILLI else ""
        gang = f", nodes={self.nodes}" if self.nodes > 1 else ""
        return f"Pod({self.name!r}, gpus={self.gpus}{share}{gang})"


@dataclass(frozen=True)
class Assignment:
    """One node's part of a placement: which GPUs, and how many thousandths of each."""

    node: str
    gpu_indices: list[int]
    gpu_milli: list[int]

    def __post_init__(self) -> None:
        if len(self.gpu_indices) != len(self.gpu_milli):
            raise ValueError(f"{self.node}: gpu_indices and gpu_milli differ in length")
        if len(set(self.gpu_indices)) != len(self.gpu_indices):
            raise ValueError(f"{self.node}: a GPU index appears twice in {self.gpu_indices}")
        if any(not 1 <= m <= MILLI for m in self.gpu_milli):
            raise ValueError(f"{self.node}: gpu_milli must be 1..1000, got {self.gpu_milli}")


@dataclass(frozen=True)
class Placement:
    """Where a pod runs: one assignment per node (several for a gang)."""

    assignments: list[Assignment]

    @property
    def nodes(self) -> list[str]:
        return [a.node for a in self.assignments]

    def to_dict(self) -> list[dict[str, Any]]:
        """A JSON-ready form (what the dispatcher stores), read back by `from_dict`."""
        return [
            {"node": a.node, "gpu_indices": list(a.gpu_indices), "gpu_milli": list(a.gpu_milli)}
            for a in self.assignments
        ]

    @classmethod
    def from_dict(cls, data: list[dict[str, Any]]) -> Placement:
        return cls(
            [Assignment(d["node"], list(d["gpu_indices"]), list(d["gpu_milli"])) for d in data]
        )


def _fields(obj: object) -> tuple[Any, ...]:
    return tuple(getattr(obj, f) for f in obj.__dataclass_fields__)  # type: ignore[attr-defined]


def _check_non_negative(obj: object, *names: str) -> None:
    for name in names:
        value = getattr(obj, name)
        if not isinstance(value, int) or value < 0:
            raise ValueError(
                f"{type(obj).__name__} {getattr(obj, 'name', '')}: {name} must be an int >= 0"
            )
