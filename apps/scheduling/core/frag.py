"""GPU fragmentation as the FGD paper measures it (Weng et al., ATC '23).

A node's free GPU capacity is *fragmented for a request type* when that request could not use
it: the whole free amount if the request does not fit the node at all (too few GPUs with
enough room, too little CPU, the wrong model), else the free thousandths on GPUs with less room
than the request asks per GPU. A node's fragmentation is the expectation of that amount over
the workload's request types, weighted by how often each type arrives.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass

from .model import Pod

# (gpus, gpu_milli, cpu_milli, gpu_models) -> what FGD distinguishes between two requests.
RequestType = tuple[int, int, int, tuple[str, ...]]


@dataclass(frozen=True)
class Workload:
    """Request types with their arrival shares (summing to 1), most frequent first."""

    types: tuple[tuple[RequestType, float], ...]

    @classmethod
    def from_pods(
        cls, pods: Iterable[Pod], *, coverage: float = 1.0, include_cpu: bool = True
    ) -> Workload:
        """The mix of `pods`, keeping the most frequent types that cover `coverage` of arrivals."""
        return cls.from_counts(
            Counter(request_type(p) for p in pods), coverage=coverage, include_cpu=include_cpu
        )

    @classmethod
    def from_counts(
        cls, counts: Counter[RequestType], *, coverage: float = 1.0, include_cpu: bool = True
    ) -> Workload:
        if not include_cpu:
            counts = Counter({t: n for t, n in counts.items() if t[0] > 0})
        total = sum(counts.values())
        if not total:
            return DEFAULT_WORKLOAD
        ranked = sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))
        kept, cum = [], 0
        for t, n in ranked:
            kept.append((t, n))
            cum += n
            if cum >= coverage * total:
                break
        return cls(tuple((t, n / cum) for t, n in kept))

    @property
    def cpu_per_gpu_milli(self) -> float:
        """CPU (millicores) the GPU requests ask per GPU thousandth; 0 if they ask none."""
        gpu = sum(share * t[0] * t[1] for t, share in self.types if t[0])
        cpu = sum(share * t[2] for t, share in self.types if t[0])
        return cpu / gpu if gpu else 0.0


def request_type(pod: Pod) -> RequestType:
    return (
        pod.gpus,
        pod.gpu_milli if pod.gpus else 0,
        pod.cpu_milli,
        tuple(sorted(pod.gpu_models)),
    )


DEFAULT_WORKLOAD = Workload((((1, 1000, 0, ()), 1.0),))


def node_fragmentation(
    shape: tuple[int, ...], cpu_free: int, model: str, workload: Workload
) -> float:
    """Expected fragmented thousandths on a node with free vector `shape` (sorted high to low).

    O(T x G) for T request types and G GPUs.
    """
    total = sum(shape)
    if total == 0:
        return 0.0
    frag = 0.0
    for (gpus, milli, cpu, models), share in workload.types:
        frag += share * _fragmented_for(shape, total, cpu_free, model, gpus, milli, cpu, models)
    return frag


def _fragmented_for(
    shape: tuple[int, ...],
    total: int,
    cpu_free: int,
    model: str,
    gpus: int,
    milli: int,
    cpu: int,
    models: tuple[str, ...],
) -> int:
    if gpus == 0 or (models and model not in models) or cpu_free < cpu:
        return total  # a CPU-only request never uses a GPU; the others cannot land here
    roomy = 0
    stranded = 0
    for f in shape:
        if f >= milli:
            roomy += 1
        else:
            stranded += f
    return stranded if roomy >= gpus else total
