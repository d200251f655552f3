"""How right is the plan? The platform's start estimate (apps/scheduling/plan.py) scored in the
simulator on a trace (issue 30).

At every EVERY-th arrival the hook makes the estimate the dispatcher would store: the policy's
own code run forward from the simulator's state (apps/scheduling/core/forecast.py, the same
function the dispatcher calls), with running jobs ending and queued jobs running for times a
runtime predictor gives. The predictor is the platform's rules (apps/scheduling/plan.py
`Predictor`) on what the simulator knows: the lengths of the arriving tenant's finished runs (a
trace's user stands for the platform's user + template), else anyone's, at least MIN_RUNS; with
none, one hour for a queued job, and for a running one about as long again as it has run, at
least an hour (the traces carry no limit to bound it, as `max_runtime_seconds` does on the
platform). The median run's start is then calibrated as the dispatcher calibrates it
(apps/scheduling/core/calibrate.py: its planned wait scaled by the ratios actual / planned wait
of the jobs planned before it that have started, learned as they start); while the calibrator
has too little history, the plan's own window is shown (runs at the predictor's early and late
quantiles). `--plan-arrivals SECONDS` makes the plan expect the last SECONDS' arrivals to come
again (`expected_arrivals`); `--plan-calibration off` scores the plan alone.

After the run, for the jobs that waited at least `min_wait_s` (5 minutes): the median of
|estimate - actual start| / actual wait (the relative error), the same for the plan's own
estimate, and the share of starts inside the window. Per tier and overall (summary.json's
`plan_error`).
"""

from __future__ import annotations

import statistics
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from apps.scheduling.core.calibrate import Calibrator
from apps.scheduling.core.forecast import (
    MIN_RUNS,
    QUANTILES,
    Plan,
    beyond_history,
    expected_arrivals,
    forecast,
    typical,
)
from apps.scheduling.core.policy import QueuedJob, TenantUsage

HISTORY = 50
NO_HISTORY_S = 3600.0
MIN_WAIT_S = 300.0
HORIZON_S = 2 * 86400.0
MAX_EXPECTED = 300
PLAN_JOBS = 300  # as the dispatcher's plan (apps/scheduling/plan.py)


@dataclass
class _Estimate:
    job_id: str
    tier: str
    arrived: float
    start: float | None
    earliest: float | None
    latest: float | None
    raw: float | None = None  # the plan's own start (before calibration)
    calibrated: bool = False


@dataclass
class PlanErrorHook:
    every: int = 1
    max_events: int = 80
    min_wait_s: float = MIN_WAIT_S
    records: list[_Estimate] = field(default_factory=list)
    arrivals: int = 0
    cpu_s: float = 0.0
    _runs: dict[str, deque] = field(default_factory=dict)
    _all: deque = field(default_factory=lambda: deque(maxlen=HISTORY))
    _sorted: dict[str, list[float]] = field(default_factory=dict)
    _sim: Any = None
    calibrate: bool = True
    arrival_window_s: float = 0.0
    rescore_s: float = 0.0
    _first: dict[str, float] = field(default_factory=dict)
    _later: dict[str, list[tuple[float, float]]] = field(default_factory=dict)
    _next_rescore: float = 0.0
    _recent: deque = field(default_factory=deque)
    calibrator: Calibrator = field(default_factory=Calibrator)
    oracle: bool = False  # `--plan-oracle`: the plan knows every present job's true length
    dump: list[dict[str, Any]] | None = None  # `--plan-dump`: what was known at each arrival

    def install(self, sim: Any) -> None:
        self._sim = sim
        sim.arrival_hooks.append(self.arrived)
        finished, start = sim._finished, sim._start

        def on_start(job: Any, placement: Any, t: float) -> None:
            first = job.start is None
            start(job, placement, t)
            if first:
                self.calibrator.started(job.job_id, t)

        sim._start = on_start
        if self.rescore_s > 0:
            sim.hooks.append(self.passed)

        def on_finish(job_id: str, attempt: int, t: float) -> None:
            job = sim.by_id[job_id]
            live, seg_start = attempt == job.attempt, job.seg_start
            finished(job_id, attempt, t)
            if live:
                self._runs.setdefault(job.tenant, deque(maxlen=HISTORY)).append(t - seg_start)
                self._all.append(t - seg_start)
                self._sorted.pop(job.tenant, None)
                self._sorted.pop("", None)

        sim._finished = on_finish

    def samples(self, tenant: str) -> list[float]:
        found = self._sorted.get(tenant)
        if found is None:
            mine = self._runs.get(tenant, ())
            source = mine if len(mine) >= MIN_RUNS else self._all
            found = sorted(source) if len(source) >= MIN_RUNS else []
            self._sorted[tenant] = found
        return found

    def runtime(self, q: float, tenant: str) -> float:
        samples = self.samples(tenant)
        return typical(samples, q) if samples else NO_HISTORY_S

    def remaining(self, q: float, tenant: str, elapsed: float) -> float:
        samples = self.samples(tenant)
        longer = [s for s in samples if s > elapsed]
        if not samples:  # nothing finished yet: an hour, or as long again as it ran (Lindy)
            return beyond_history(q, max(elapsed, NO_HISTORY_S))
        if not longer:
            return beyond_history(q, elapsed)
        return typical(longer, q) - elapsed

    def arrived(self, sim: Any, job: Any, t: float) -> None:
        self.arrivals += 1
        scheduler = sim.scheduler
        if job.job_id in scheduler.queued:
            self._recent.append(scheduler.queued[job.job_id])
            while self._recent and self._recent[0].submit <= t - self.arrival_window_s:
                self._recent.popleft()
        if (self.arrivals - 1) % self.every or job.job_id not in scheduler.queued:
            return
        expected = expected_arrivals(t, self._recent, self.arrival_window_s, HORIZON_S,
                                     MAX_EXPECTED) if self.arrival_window_s > 0 else []  # fmt: skip
        began = time.process_time()

        plans: list[Plan] = []

        def start_at(q: float) -> float | None:
            plan = self._forecast(sim, t, q, until=job.job_id, expected=expected)
            plans.append(plan)
            return plan.starts.get(job.job_id)

        early_q, middle_q, late_q = QUANTILES
        middle = start_at(middle_q)
        if self.dump is not None:
            self.dump.append(self._known(sim, job, t, middle, plans[0]))
        shown = None
        if middle is not None:
            self.calibrator.planned(job.job_id, job.tier, t, middle)
            if self.calibrate:
                shown = self.calibrator.estimate(job.tier, t, middle)
        if shown is not None:
            record = _Estimate(job.job_id, job.tier, t, shown.start, shown.earliest,
                               shown.latest, raw=middle, calibrated=True)  # fmt: skip
        else:  # the plan's own window: its early and late runs
            starts = [start_at(early_q), middle, start_at(late_q)]
            known = [s for s in starts if s is not None]
            record = _Estimate(job.job_id, job.tier, t, middle, min(known) if known else None,
                               starts[2], raw=middle)  # fmt: skip
        self.records.append(record)
        if record.calibrated and record.start is not None:
            self._first[job.job_id] = record.start
        self.cpu_s += time.process_time() - began

    def _known(self, sim: Any, job: Any, t: float, middle: float | None, plan: Plan) -> dict:
        """What the dispatcher knows at a job's arrival (`--plan-dump`, to study estimators)."""
        scheduler = sim.scheduler
        levels = {name: tier.level for name, tier in scheduler.tiers.items()}
        mine = levels.get(job.tier, 0)
        ahead = higher = 0.0
        for job_id in plan.order:
            if job_id == job.job_id:
                break
            other = scheduler.queued.get(job_id)
            if other is None:
                continue
            gpuh = other.gpus * other.nodes * self.runtime(0.5, other.tenant) / 3600
            ahead += gpuh
            higher += gpuh if levels.get(other.tier, 0) > mine else 0.0
        queued = list(scheduler.queued.values())
        return {
            "job": job.job_id, "tier": job.tier, "tenant": job.tenant, "t": t,
            "gpus": job.gpus * max(job.nodes, 1), "nodes": job.nodes,
            "planned": None if middle is None else middle - t,
            "runtime": self.runtime(0.5, job.tenant),
            "ahead_gpuh": ahead, "ahead_higher_gpuh": higher,
            "queued": len(queued), "queued_gpus": sum(q.gpus * q.nodes for q in queued),
            "queued_higher_gpus": sum(q.gpus * q.nodes for q in queued
                                      if levels.get(q.tier, 0) > mine),
            "running_gpus": sum(r.gpus * r.nodes for r in scheduler.running.values()),
        }  # fmt: skip

    def _forecast(
        self,
        sim: Any,
        t: float,
        q: float,
        until: str | None = None,
        expected: list[QueuedJob] | None = None,
        max_jobs: int | None = None,
    ) -> Plan:
        """The plan at quantile q from the simulator's state at t (`max_jobs`: the first queued
        jobs in the platform's order only, as the dispatcher plans at most PLAN_JOBS)."""
        scheduler = sim.scheduler
        tenant_of = {r.job_id: sim.by_id[r.job_id].tenant for r in scheduler.running.values()}
        usage = {
            tenant: TenantUsage(scheduler._tenant_tier.get(tenant, "free"),
                                use.value(t, scheduler.config.half_life_s))
            for tenant, use in scheduler._tenant_usage.items()
            if tenant in scheduler._tenant_tier
        }  # fmt: skip
        queued = list(scheduler.queued.values())
        if max_jobs is not None:
            levels = {name: tier.level for name, tier in scheduler.tiers.items()}
            queued = sorted(queued, key=lambda j: (-levels.get(j.tier, 0), j.submit))[:max_jobs]
        if self.oracle:  # the true lengths: what is left is the arrivals the plan cannot see

            def end_of(r: Any) -> float:
                job = sim.by_id[r.job_id]
                return max(t, job.seg_progress_from + job.duration - job.done)

            def runtime_of(j: QueuedJob) -> float:
                job = sim.by_id[j.job_id]
                overhead = sim.settings.restart_overhead_s if job.preemptions else 0.0
                return overhead + job.duration - job.done
        else:

            def end_of(r: Any) -> float:
                return t + self.remaining(q, tenant_of[r.job_id], t - r.started_at)

            def runtime_of(j: QueuedJob) -> float:
                return self.runtime(q, j.tenant)

        return forecast(
            t, sim.cluster, queued, list(scheduler.running.values()),
            scheduler.tiers, usage, config=scheduler.config, held_reservation=scheduler._held,
            end_of=end_of, runtime_of=runtime_of,
            max_events=self.max_events, strategy=sim.settings.strategy, until=until,
            expected=expected or [],
        )  # fmt: skip

    def passed(self, sim: Any, t: float) -> None:
        """`rescore_s` > 0: every rescore_s of simulated time, the plan of every waiting job
        (the dispatcher's: the first PLAN_JOBS, the median run, a job's first calibrated
        estimate standing while the plan is not later), kept to score what a job shows later
        in its wait."""
        if t < self._next_rescore or not sim.scheduler.queued:
            return
        self._next_rescore = t + self.rescore_s
        began = time.process_time()
        plan = self._forecast(sim, t, QUANTILES[1], max_jobs=PLAN_JOBS)
        for job_id, start in plan.starts.items():
            first = self._first.get(job_id)
            shown = max(start, first, t) if first is not None and self.calibrate else start
            self._later.setdefault(job_id, []).append((t, shown))
        self.cpu_s += time.process_time() - began

    def summary(self) -> dict[str, Any]:
        by_id = self._sim.by_id if self._sim is not None else {}
        groups: dict[str, list[tuple[_Estimate, float]]] = {}
        for record in self.records:
            job = by_id.get(record.job_id)
            if job is None or job.start is None:
                continue
            wait = job.start - record.arrived
            if wait < self.min_wait_s:
                continue
            groups.setdefault("all", []).append((record, job.start))
            groups.setdefault(record.tier, []).append((record, job.start))
        return {
            "every": self.every,
            "arrivals": self.arrivals,
            "estimated": len(self.records),
            "min_wait_s": self.min_wait_s,
            "cpu_seconds": round(self.cpu_s, 1),
            "groups": {name: _score(rows) for name, rows in sorted(groups.items())},
            **({"later": self._later_score(by_id)} if self.rescore_s > 0 else {}),
        }

    def _later_score(self, by_id: dict[str, Any]) -> dict[str, Any]:
        """The estimates shown later in a wait (`passed`), for the jobs that waited at least
        min_wait_s: per job the median of |shown - start| / the wait left when shown, and of
        |shown - start| / the whole wait; then the median over the jobs."""
        left, whole = [], []
        for job_id, shown in self._later.items():
            job = by_id.get(job_id)
            if job is None or job.start is None or job.start - job.submit < self.min_wait_s:
                continue
            before = [(t, at) for t, at in shown if t < job.start]
            if not before:
                continue
            left.append(statistics.median(abs(at - job.start) / (job.start - t)
                                          for t, at in before))  # fmt: skip
            whole.append(statistics.median(abs(at - job.start) / (job.start - job.submit)
                                           for t, at in before))  # fmt: skip
        return {
            "every_s": self.rescore_s,
            "jobs": len(left),
            "median_relative_error_of_wait_left": statistics.median(left) if left else None,
            "median_relative_error_of_whole_wait": statistics.median(whole) if whole else None,
        }


def _score(rows: list[tuple[_Estimate, float]]) -> dict[str, Any]:
    relative, raw, inside, none, calibrated = [], [], 0, 0, 0
    for record, start in rows:
        if record.start is None:
            none += 1
            continue
        wait = start - record.arrived
        relative.append(abs(record.start - start) / wait)
        if record.raw is not None:
            raw.append(abs(record.raw - start) / wait)
        calibrated += record.calibrated
        if record.earliest is not None and record.latest is not None:
            inside += record.earliest <= start <= record.latest
    n = len(relative)
    return {
        "waited": len(rows),
        "no_estimate": none,
        "calibrated": calibrated,
        "median_relative_error": statistics.median(relative) if relative else None,
        "raw_median_relative_error": statistics.median(raw) if raw else None,
        "in_window": inside / n if n else None,
    }


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.0f}%"


def plan_table(summary: dict[str, Any]) -> str:
    lines = [
        f"plan estimate ({summary['estimated']} of {summary['arrivals']} arrivals, every "
        f"{summary['every']}; jobs that waited >= {summary['min_wait_s'] / 60:.0f} min)",
        "",
        "| group | waited | no estimate | calibrated | median relative error | "
        "(plan alone) | starts in window |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, s in summary["groups"].items():
        lines.append(
            f"| {name} | {s['waited']} | {s['no_estimate']} | {s['calibrated']} | "
            f"{_pct(s['median_relative_error'])} | {_pct(s['raw_median_relative_error'])} | "
            f"{_pct(s['in_window'])} |"
        )
    later = summary.get("later")
    if later:
        lines += [
            "",
            f"re-estimated every {later['every_s'] / 60:.0f} min while waiting ({later['jobs']} "
            f"jobs): median relative error {_pct(later['median_relative_error_of_wait_left'])} "
            f"of the wait left, {_pct(later['median_relative_error_of_whole_wait'])} of the "
            "whole wait",
        ]
    return "\n".join(lines) + "\n"
