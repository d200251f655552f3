"""How wrong is `estimated_start_at`? The platform's estimate, measured in the simulator.

At an arrival (every `every`-th one; 1 = all) the hook computes the arriving job's start estimate
with the very replay the API runs (apps/scheduling/core/estimate.py) from the simulator's state
at that moment, the way apps/admission/estimates.py builds it from the database:

- the pool: the cluster's GPUs now (one GPU model in the simulator);
- held GPUs: every running job gives its GPUs back at its current attempt's start + its expected
  runtime (a job signalled to stop: now, as the platform counts an attempt that is stopping);
- the queue: the queued jobs in the platform's `queue_position` order, tier level, then tier rank
  (the simulator's tiers carry no rank: their Slurm QOS priority orders them the same way,
  enterprise > pro > free), then submit time. The arriving job is last of its tier, so the jobs
  of its tier and the tiers above are replayed, and the replay stops at it. `order="policy"`
  replays the scheduler's own order instead (fair share, aging; not for `slurm`, whose order
  is a cache the pass refreshes): what a platform that shows the policy's order would get.

Expected runtimes, two estimators:

- `history`, like the platform's: the median of the last 50 finished runs (at least 3) of the
  same tenant (the simulator has no job templates; a trace's tenant stands for them), else the
  median of the last 50 finished runs of anyone, else one hour. A run's length is its last
  attempt's (restart included), as the platform takes a successful attempt's start to end.
  Nothing caps it (the traces carry no `max_runtime_seconds`).
- `oracle`: the true durations (a running job's true end; a queued job's remaining work plus
  its restart), so its error is the method's alone: order, backfill, preemption, fragmentation.

After the run each estimate is compared with the job's first start. Per tier, for jobs of more
than 8 GPUs and overall: median and p90 absolute error, bias (median of estimate - start:
positive = the estimate was late, pessimistic), the share within 10 minutes and within 25% of
the job's actual wait, and the same over the jobs that waited (wait > 0); jobs that started at
once are counted, with how many of them were estimated to start at once.
"""

from __future__ import annotations

import statistics
import time
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from apps.scheduling.core.estimate import Replay, Waiting
from apps.scheduling.sim.report import percentile

HISTORY = 50  # finished runs the expected runtime looks at
MIN_RUNS = 3
DEFAULT_RUNTIME_S = 3600.0  # no history at all yet
NEAR_S = 600.0  # "within 10 minutes"
NEAR_SHARE = 0.25  # "within 25% of the actual wait"
ESTIMATORS = ("history", "oracle")


@dataclass
class _Record:
    job_id: str
    tier: str
    gpus: int
    arrived: float
    estimates: dict[str, float | None]


@dataclass
class EstimateErrorHook:
    every: int = 1  # estimate every k-th arrival
    order: str = "platform"  # platform | policy
    records: list[_Record] = field(default_factory=list)
    arrivals: int = 0
    cpu_s: float = 0.0  # CPU seconds spent estimating (inside the simulation's CPU time)
    _runs: dict[str, deque] = field(default_factory=dict)  # tenant -> last run lengths
    _all_runs: deque = field(default_factory=lambda: deque(maxlen=HISTORY))
    _typical: dict[str, float] = field(default_factory=dict)  # tenant -> median (cache)
    _typical_all: float | None = None
    _sim: Any = None

    def install(self, sim: Any) -> None:
        if self.order not in ("platform", "policy"):
            raise ValueError(f"unknown order {self.order!r}")
        if self.order == "policy" and sim.scheduler.config.ordering == "slurm":
            raise ValueError("order='policy' is not available with the slurm ordering")
        self._sim = sim
        sim.arrival_hooks.append(self.arrived)
        # The engine has no finish hook: wrap this simulation's finish handler to see each
        # finished run (its last attempt's length), as the platform reads succeeded attempts.
        finished = sim._finished

        def on_finish(job_id: str, attempt: int, t: float) -> None:
            job = sim.by_id[job_id]
            live, seg_start = attempt == job.attempt, job.seg_start  # else a stale event
            finished(job_id, attempt, t)
            if live:
                self._finished(job.tenant, t - seg_start)

        sim._finished = on_finish

    def _finished(self, tenant: str, length: float) -> None:
        runs = self._runs.get(tenant)
        if runs is None:
            runs = self._runs[tenant] = deque(maxlen=HISTORY)
        runs.append(length)
        self._all_runs.append(length)
        self._typical.pop(tenant, None)
        self._typical_all = None

    def expected_runtime(self, tenant: str) -> float:
        """The `history` estimator (see the module doc)."""
        typical = self._typical.get(tenant)
        if typical is None:
            runs = self._runs.get(tenant, ())
            if len(runs) >= MIN_RUNS:
                typical = statistics.median(runs)
            else:
                if self._typical_all is None:
                    runs = self._all_runs
                    self._typical_all = (
                        statistics.median(runs) if len(runs) >= MIN_RUNS else DEFAULT_RUNTIME_S
                    )
                typical = self._typical_all
            self._typical[tenant] = typical
        return typical

    # --- at an arrival -----------------------------------------------------------------------

    def arrived(self, sim: Any, job: Any, t: float) -> None:
        self.arrivals += 1
        if (self.arrivals - 1) % self.every:
            return
        began = time.process_time()
        scheduler = sim.scheduler
        me = scheduler.queued.get(job.job_id)
        if me is not None:
            queue = self._queue(scheduler, me, t)
            estimates = {name: self._estimate(sim, t, me, queue, name) for name in ESTIMATORS}
            self.records.append(_Record(job.job_id, job.tier, job.gpus * job.nodes, t, estimates))
        self.cpu_s += time.process_time() - began

    def _queue(self, scheduler: Any, me: Any, t: float) -> list[Any]:
        """The queued jobs up to `me` (included), in the order the replay takes them."""
        if self.order == "policy":
            out = []
            for queued in scheduler._order(t):
                out.append(queued)
                if queued is me:
                    break
            return out
        tiers = scheduler.tiers

        def rank(tier: str) -> tuple[int, int]:
            policy = tiers[tier]
            return -policy.level, -policy.qos_priority

        mine = rank(me.tier)
        ahead = [q for q in scheduler.queued.values() if rank(q.tier) <= mine]
        ahead.sort(key=lambda q: (rank(q.tier), q.submit, q.seq))
        return ahead

    def _estimate(self, sim: Any, t: float, me: Any, queue: list[Any], name: str) -> float | None:
        scheduler = sim.scheduler
        oracle = name == "oracle"
        held = []
        for running in scheduler.running.values():
            gpus = running.gpus * running.nodes
            job = sim.by_id[running.job_id]
            if running.preempted_for is not None:
                end = t + sim.settings.grace_s if oracle else t  # stopping
            elif oracle:
                end = job.seg_progress_from + job.duration - job.done  # its FINISH event
            else:
                end = running.started_at + self.expected_runtime(job.tenant)
            held.append((end, gpus))
        if oracle:
            waiting: Iterable[Waiting] = (
                Waiting(q.job_id, q.gpus * q.nodes, q.est_runtime_s) for q in queue
            )
        else:
            waiting = (
                Waiting(q.job_id, q.gpus * q.nodes, self.expected_runtime(q.tenant)) for q in queue
            )
        replay = Replay.start(t, scheduler.view.total, held)
        for key, start in replay.starts(waiting):
            if key == me.job_id:
                return start
        return None

    # --- after the run -----------------------------------------------------------------------

    def summary(self) -> dict[str, Any]:
        by_id = self._sim.by_id if self._sim is not None else {}
        out: dict[str, Any] = {
            "every": self.every,
            "order": self.order,
            "arrivals": self.arrivals,
            "estimated": len(self.records),
            "cpu_seconds": self.cpu_s,
            "history": HISTORY,
            "min_runs": MIN_RUNS,
            "default_runtime_s": DEFAULT_RUNTIME_S,
        }
        for name in ESTIMATORS:
            groups: dict[str, list[tuple[float | None, float, float]]] = {}
            for record in self.records:
                job = by_id.get(record.job_id)
                if job is None or job.start is None:
                    continue
                row = (record.estimates[name], job.start, job.start - record.arrived)
                groups.setdefault("all", []).append(row)
                groups.setdefault(record.tier, []).append(row)
                if record.gpus > 8:
                    groups.setdefault("gpus>8", []).append(row)
            out[name] = {group: error_stats(rows) for group, rows in sorted(groups.items())}
        return out


def error_stats(rows: list[tuple[float | None, float, float]]) -> dict[str, Any]:
    """rows: (estimate or None, actual start, actual wait)."""
    known = [(e, s, w) for e, s, w in rows if e is not None]
    waited = [(e, s, w) for e, s, w in known if w > 0]
    at_once = [(e, s, w) for e, s, w in known if w <= 0]
    stats = _stats(known)
    stats.update(
        jobs=len(rows),
        no_estimate=len(rows) - len(known),
        started_at_once=len(at_once),
        started_at_once_estimated_at_once=sum(1 for e, s, _ in at_once if e <= s),
        waited=_stats(waited),
    )
    return stats


def _stats(rows: list[tuple[float, float, float]]) -> dict[str, Any]:
    signed = [e - s for e, s, _ in rows]
    absolute = [abs(x) for x in signed]
    n = len(rows)
    return {
        "n": n,
        "abs_error_p50_s": percentile(absolute, 50),
        "abs_error_p90_s": percentile(absolute, 90),
        "bias_p50_s": percentile(signed, 50),
        "late_share": sum(1 for x in signed if x > 0) / n if n else None,
        "within_10min": sum(1 for x in absolute if x <= NEAR_S) / n if n else None,
        "within_25pct": (
            sum(1 for x, (_, _, w) in zip(absolute, rows, strict=True) if x <= NEAR_SHARE * w) / n
            if n
            else None
        ),
    }


def error_table(summary: dict[str, Any]) -> str:
    """The CLI's table: per estimator and group, error figures in minutes."""
    lines = [
        f"estimated_start_at error ({summary['estimated']} of {summary['arrivals']} arrivals, "
        f"every {summary['every']}, {summary['order']} order; minutes; bias > 0: estimate late)",
        "",
        "| estimator | jobs | median abs error | p90 abs error | bias | within 10 min | "
        "within 25% of wait | waited: n | waited: median / p90 abs error | waited: bias | "
        "waited: within 25% |",
        "|---" * 11 + "|",
    ]
    for name in ESTIMATORS:
        for group, s in summary.get(name, {}).items():
            w = s["waited"]
            lines.append(
                f"| {name} {group} | {s['jobs']} | {_m(s['abs_error_p50_s'])} | "
                f"{_m(s['abs_error_p90_s'])} | {_m(s['bias_p50_s'])} | {_pct(s['within_10min'])} | "
                f"{_pct(s['within_25pct'])} | {w['n']} | {_m(w['abs_error_p50_s'])} / "
                f"{_m(w['abs_error_p90_s'])} | {_m(w['bias_p50_s'])} | {_pct(w['within_25pct'])} |"
            )
    return "\n".join(lines) + "\n"


def _m(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds / 60:.1f}"


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.0f}%"
