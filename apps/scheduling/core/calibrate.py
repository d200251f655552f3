"""Calibrated start estimates: the plan's wait corrected by its own past errors (conformal).

The plan (forecast.py) starts each queued job as the policy would if every job ran its predicted
length and nothing new arrived. It is biased (later arrivals of a higher tier overtake a waiting
job, so the plan is early for the lower tiers) and its runtime-quantile window covers the spread
of running jobs' ends but not the arrivals'. The calibrator learns both from the plan itself:

- When a job is planned, its planned wait (planned start - now) is noted in the history of its
  bucket: its tier and the planned wait's order of magnitude (steps of 4x from 4 minutes,
  `bucket`), the last HISTORY jobs planned. Its ratio r = actual wait / max(planned wait,
  FLOOR_S) is known when it starts; while it still waits, r is at least its wait so far / the
  same, a censored value. Only what is known at `now` counts, so an estimate uses nothing of
  the future (online, split conformal).
- The ratios' quantiles are Kaplan-Meier's: counting only the jobs that started would
  over-represent the short waits whenever long ones are still open (a congested hour's jobs
  join the history only hours later, after the estimates made in it).
- A new window is now + planned x the LOW and HIGH quantiles of r in the bucket: with
  exchangeable errors, a share HIGH - LOW of starts fall inside it. The estimate is the plan's
  own start, moved into the window where it falls outside. (Its runs at the mean run length,
  forecast.py `typical`, are about as close as any quantile of r could make them: 46% against
  47% at r's 0.35 quantile on cluster04, docs/scheduling-fairness-log.md.) A bucket with fewer than MIN_SAMPLES started jobs borrows the same bucket of
  every tier; with too few there the calibrator gives nothing and the caller keeps the plan.

The dispatcher's plan (apps/scheduling/plan.py) and the simulator's score of it
(apps/scheduling/sim/plan_error.py) both use this class. Pure: no Django; times in seconds.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field

FLOOR_S = 60.0  # a planned wait under a minute counts as a minute (the ratio stays finite)
STEP = 4.0  # buckets: planned wait < 4 min, < 16 min, < 64 min, < 4.3 h, < 17 h, more
BUCKETS = 6
MIN_SAMPLES = 10  # started jobs a bucket needs before it is used alone
HISTORY = 400  # jobs kept per bucket (the latest planned)
LOW, HIGH = 0.1, 0.9  # the window's quantiles of actual / planned wait


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
class _Noted:
    """One planned job in a bucket's history: when it was planned, its planned wait (at least
    FLOOR_S), and when it started (None while it waits)."""

    since: float
    scale: float
    started: float | None = None
    dropped: bool = False  # it left the queue unstarted: neither a start nor a wait


def survival_quantiles(seen: list[tuple[float, bool]], qs: tuple[float, ...]) -> list[float]:
    """Kaplan-Meier quantiles of ratios: `seen` holds (ratio, started); a job still waiting is
    censored at its ratio so far (its ratio will be at least that). A quantile the curve does not
    reach (too many still waiting) is the largest ratio seen."""
    seen = sorted(seen, key=lambda r: (r[0], not r[1]))  # starts before waits at a tie
    at_risk, alive, out, i = len(seen), 1.0, [], 0
    wanted = sorted(range(len(qs)), key=lambda k: qs[k])
    found: dict[int, float] = {}
    while i < len(seen) and len(found) < len(qs):
        ratio, starts, waits = seen[i][0], 0, 0
        while i < len(seen) and seen[i][0] == ratio:
            starts += seen[i][1]
            waits += not seen[i][1]
            i += 1
        if starts:
            alive *= 1 - starts / at_risk
            for k in wanted:
                if k not in found and 1 - alive >= qs[k] - 1e-12:
                    found[k] = ratio
        at_risk -= starts + waits
    for k in range(len(qs)):
        out.append(found.get(k, seen[-1][0] if seen else 0.0))
    return out


@dataclass
class Calibrator:
    """Online: `planned` when a job is first planned, `started` when it starts, `estimate` for a
    job's calibrated start. One per dispatcher process; one per simulation."""

    min_samples: int = MIN_SAMPLES
    _history: dict[tuple[str | int, ...], deque[_Noted]] = field(default_factory=dict)
    _open: dict[str, tuple[str, float, float, _Noted]] = field(default_factory=dict)
    _cached: dict[tuple[str | int, ...], list[float]] = field(default_factory=dict)
    _cached_at: float | None = None

    def planned(self, job: str, tier: str, now: float, planned_start: float) -> None:
        """Note a job's plan (the first one counts: the wait it predicted from its arrival)."""
        if job in self._open:
            return
        planned = max(0.0, planned_start - now)
        noted = _Noted(now, max(planned, FLOOR_S))
        self._open[job] = (tier, now, planned, noted)
        for key in ((tier, bucket(planned)), (bucket(planned),)):
            self._history.setdefault(key, deque(maxlen=HISTORY)).append(noted)
        self._cached_at = None

    def started(self, job: str, at: float) -> None:
        """A planned job started at `at`: its ratio joins the history."""
        noted = self._open.pop(job, None)
        if noted is not None:
            noted[3].started = max(at, noted[1])
            self._cached_at = None

    def forget(self, job: str) -> None:
        """A planned job left the queue without starting (cancelled)."""
        noted = self._open.pop(job, None)
        if noted is not None:
            noted[3].dropped = True
            self._cached_at = None

    def open_jobs(self) -> list[str]:
        """The jobs planned and not yet started nor forgotten."""
        return list(self._open)

    def quantiles(self, tier: str, planned_wait_s: float, now: float) -> list[float]:
        """The LOW and HIGH quantiles of actual / planned wait an estimate for this tier
        and planned wait uses at `now` ([] while fewer than min_samples of its jobs started)."""
        if self._cached_at != now:
            self._cached, self._cached_at = {}, now
        for key in ((tier, bucket(planned_wait_s)), (bucket(planned_wait_s),)):
            if key not in self._cached:
                self._cached[key] = self._survival(key, now)
            if self._cached[key]:
                return self._cached[key]
        return []

    def _survival(self, key: tuple[str | int, ...], now: float) -> list[float]:
        seen = [
            ((noted.started if noted.started is not None else max(now, noted.since))
             - noted.since) / noted.scale
            for noted in self._history.get(key, ())
            if not noted.dropped
        ]  # fmt: skip
        started = [n.started is not None for n in self._history.get(key, ()) if not n.dropped]
        if sum(started) < self.min_samples:
            return []
        return survival_quantiles(list(zip(seen, started, strict=True)), (LOW, HIGH))

    def estimate(self, tier: str, now: float, planned_start: float) -> Calibrated | None:
        """The calibrated start and window of a job planned to start at `planned_start`, or
        None while the history is too short."""
        planned = max(0.0, planned_start - now)
        found = self.quantiles(tier, planned, now)
        if not found:
            return None
        scale = max(planned, FLOOR_S)
        low, high = (now + scale * r for r in found)
        return Calibrated(start=min(max(planned_start, low), high), earliest=low, latest=high)


__all__ = [
    "BUCKETS", "Calibrated", "Calibrator", "FLOOR_S", "HIGH", "LOW", "bucket",
    "survival_quantiles",
]  # fmt: skip
