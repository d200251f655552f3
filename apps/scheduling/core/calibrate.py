"""Calibrated start estimates: the plan's wait corrected by its own past errors (conformal).

The plan (forecast.py) starts each queued job as the policy would if every job ran its predicted
length and nothing new arrived. It is biased (later arrivals of a higher tier overtake a waiting
job, so the plan is early for the lower tiers) and its runtime-quantile window covers the spread
of running jobs' ends but not the arrivals'. The calibrator learns both from the plan itself:

- When a job is planned, its planned wait (planned start - now) is noted; when it starts, the
  ratio r = actual wait / max(planned wait, FLOOR_S) joins the history of its bucket: its tier
  and the planned wait's order of magnitude (steps of 4x from 4 minutes, `bucket`). Only
  starts already seen count, so an estimate uses nothing of the future (online, split conformal).
- A new estimate is now + planned x median(r) of the bucket, its window now + planned x the
  LOW and HIGH quantiles of r: with exchangeable errors, a share HIGH - LOW of starts fall
  inside it. A bucket with fewer than MIN_SAMPLES ratios borrows the same bucket of every tier;
  with too few there the calibrator gives nothing and the caller keeps the raw plan.

The dispatcher's plan (apps/scheduling/plan.py) and the simulator's score of it
(apps/scheduling/sim/plan_error.py) both use this class. Pure: no Django; times in seconds.
"""

from __future__ import annotations

import bisect
import math
from collections import deque
from dataclasses import dataclass, field

from apps.scheduling.core.forecast import quantile

FLOOR_S = 60.0  # a planned wait under a minute counts as a minute (the ratio stays finite)
STEP = 4.0  # buckets: planned wait < 4 min, < 16 min, < 64 min, < 4.3 h, < 17 h, more
BUCKETS = 6
MIN_SAMPLES = 10  # ratios a bucket needs before it is used alone
HISTORY = 400  # ratios kept per bucket (the latest)
LOW, MIDDLE, HIGH = 0.1, 0.35, 0.9  # the window's quantiles and the estimate's


def bucket(planned_wait_s: float) -> int:
    """The order of magnitude of a planned wait: 0 for under FLOOR_S x STEP, then one per STEP."""
    scaled = max(planned_wait_s, FLOOR_S) / FLOOR_S
    return min(BUCKETS - 1, int(math.log(scaled, STEP)))


@dataclass(frozen=True, slots=True)
class Calibrated:
    start: float
    earliest: float
    latest: float


@dataclass(slots=True)
class _Ratios:
    """The latest ratios of one bucket, kept in arrival order and sorted."""

    recent: deque[float] = field(default_factory=lambda: deque(maxlen=HISTORY))
    ordered: list[float] = field(default_factory=list)

    def add(self, ratio: float) -> None:
        if len(self.recent) == self.recent.maxlen:
            old = self.recent[0]
            del self.ordered[bisect.bisect_left(self.ordered, old)]
        self.recent.append(ratio)
        bisect.insort(self.ordered, ratio)


@dataclass
class Calibrator:
    """Online: `planned` when a job is first planned, `started` when it starts, `estimate` for a
    job's calibrated start. One per dispatcher process; one per simulation."""

    min_samples: int = MIN_SAMPLES
    _ratios: dict[tuple[str | int, ...], _Ratios] = field(default_factory=dict)
    _open: dict[str, tuple[str, float, float]] = field(default_factory=dict)

    def planned(self, job: str, tier: str, now: float, planned_start: float) -> None:
        """Note a job's plan (the first one counts: the wait it predicted from its arrival)."""
        if job not in self._open:
            self._open[job] = (tier, now, max(0.0, planned_start - now))

    def started(self, job: str, at: float) -> None:
        """A planned job started at `at`: its ratio joins the history."""
        noted = self._open.pop(job, None)
        if noted is None:
            return
        tier, since, planned = noted
        ratio = max(0.0, at - since) / max(planned, FLOOR_S)
        for key in ((tier, bucket(planned)), (bucket(planned),)):
            self._ratios.setdefault(key, _Ratios()).add(ratio)

    def forget(self, job: str) -> None:
        """A planned job left the queue without starting (cancelled)."""
        self._open.pop(job, None)

    def open_jobs(self) -> list[str]:
        """The jobs planned and not yet started nor forgotten."""
        return list(self._open)

    def ratios(self, tier: str, planned_wait_s: float) -> list[float]:
        """The sorted ratios an estimate for this tier and planned wait uses ([] if too few)."""
        for key in ((tier, bucket(planned_wait_s)), (bucket(planned_wait_s),)):
            found = self._ratios.get(key)
            if found is not None and len(found.ordered) >= self.min_samples:
                return found.ordered
        return []

    def estimate(self, tier: str, now: float, planned_start: float) -> Calibrated | None:
        """The calibrated start and window of a job planned to start at `planned_start`, or
        None while the history is too short."""
        planned = max(0.0, planned_start - now)
        ratios = self.ratios(tier, planned)
        if not ratios:
            return None
        scale = max(planned, FLOOR_S)
        at = [now + scale * quantile(ratios, q) for q in (LOW, MIDDLE, HIGH)]
        return Calibrated(start=at[1], earliest=at[0], latest=at[2])


__all__ = ["BUCKETS", "Calibrated", "Calibrator", "FLOOR_S", "HIGH", "LOW", "MIDDLE", "bucket"]
