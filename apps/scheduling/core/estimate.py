"""Start estimates of queued jobs: a replay of the queue on one GPU pool (`estimated_start_at`).

Method (docs/admission.md, "Where am I"): the pool has `capacity` GPUs. Every job holding GPUs
now gives them back at its expected end; the GPUs not held are free now. Queued jobs are then
taken in queue order, and each starts as soon as enough GPUs are free (the earliest expected
ends are released first), then holds its GPUs for its own expected runtime. A job never starts
before one ahead of it (no backfill); preemption, fragmentation across nodes and gang placement
are ignored: the estimate errs late for small jobs the policy backfills, and early for big gangs
that need whole free nodes. A job needing more GPUs than the pool has gets no estimate, nor
does one for which not enough GPUs will ever be free.

Times are plain seconds on any clock (the platform replays in seconds from "now", the simulator
in simulated seconds); expected runtimes are the caller's: the platform takes the median of the
template's recent runs capped by `max_runtime_seconds`, the simulator measures either that kind
of estimator or the true durations (apps/scheduling/sim/estimate.py).

Used by apps/admission/estimates.py (the API's figure) and the simulator's measurement of its
error, so both run this very code.
"""

from __future__ import annotations

import heapq
from collections.abc import Hashable, Iterable, Iterator
from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)
class Waiting:
    """A queued job as the replay sees it."""

    key: Hashable
    gpus: int  # GPUs it needs in all (GPUs per node x nodes)
    runtime_s: float  # how long it is expected to hold them


@dataclass(slots=True)
class Replay:
    """Where a replay stands: the time reached, the GPUs free then, and the GPUs still held with
    when they come back (a heap of (end, GPUs)). A replay can go on with jobs queued later."""

    capacity: int
    t: float
    free: int
    releases: list[tuple[float, int]] = field(default_factory=list)

    @classmethod
    def start(cls, now: float, capacity: int, held: Iterable[tuple[float, int]]) -> Replay:
        """The pool at `now`: `held` is (expected end, GPUs) of each job holding GPUs; an end
        already past counts as now (the job is late: it is expected to end at any moment)."""
        releases = [(max(end, now), gpus) for end, gpus in held]
        heapq.heapify(releases)
        return cls(capacity, now, capacity - sum(gpus for _, gpus in releases), releases)

    def copy(self) -> Replay:
        return Replay(self.capacity, self.t, self.free, list(self.releases))

    def starts(self, queue: Iterable[Waiting]) -> Iterator[tuple[Hashable, float]]:
        """(key, estimated start) of each job of `queue`, taken in the order given, that gets
        one. Lazy: a caller that wants one job's estimate stops when it has it. The replay
        advances as it goes (copy it first to keep it)."""
        releases = self.releases
        for job in queue:
            need = job.gpus
            if need > self.capacity:
                continue  # can never fit
            while self.free < need and releases:
                end, gpus = heapq.heappop(releases)
                if end > self.t:
                    self.t = end
                self.free += gpus
            if self.free < need:
                continue  # nothing more will free: no estimate
            self.free -= need
            heapq.heappush(releases, (self.t + job.runtime_s, need))
            yield job.key, self.t


def estimate_starts(
    now: float, capacity: int, held: Iterable[tuple[float, int]], queue: Iterable[Waiting]
) -> dict[Hashable, float]:
    """{key: estimated start} of the queued jobs, `queue` in queue order (see the module doc)."""
    return dict(Replay.start(now, capacity, held).starts(queue))
