"""The dispatcher's plan: when each queued job will start, stored with the job (API.md "Honest
waiting": `estimated_start_at`, `estimated_start_window`, `queue_position`, the reason's words).

Method (docs/scheduling.md, "Start estimates"):
- The policy's own code run forward (apps/scheduling/core/forecast.py) from the state a pass
  hands it: the same cluster, running jobs, queue heads, tiers, usage, reservations and nodes
  being added. Running jobs end at their predicted times, each started job runs its predicted
  length; the policy still reasons by limits, as it does live.
- The runtime predictor (`Predictor`): the durations of a user's last successful runs of the
  same template (of any user when the user has fewer than MIN_RUNS), at most
  `max_runtime_seconds`; a running job's end is taken from the runs longer than it has already
  run (none left: about as long again as it ran, the Lindy rule, within its limit; no history
  at all: its limit). Three runs of the forecast, at the predictor's QUANTILES, give
  the window (earliest, latest) and the estimate (the middle run, whose jobs run the mean of
  their history: forecast.py `typical`). Without history a job is predicted to run to its
  limit (the window opens at a quarter of it).
- Calibrated by the plan's own past errors (apps/scheduling/core/calibrate.py): once enough
  planned jobs started, a job's first window is its plan's wait scaled by the quantiles of
  the ratios (actual wait / planned wait) of earlier jobs of its tier and planned wait (those
  still waiting counted as censored), its estimate the plan's start moved into that window;
  that first estimate stands while later plans are not later than it.
- Made in a dispatcher pass when what it depends on changed (the queue's heads, the running
  jobs, the nodes being added) or PLAN_SECONDS passed, at most once per MIN_SECONDS per
  process, over at most PLAN_JOBS queued jobs (the first in queue order) and `max_events`
  passes each: its cost is bounded whatever the queue. Written only where it changed, so an
  estimate does not move with the clock; never computed per request.
- `queue_position` is the order in which the plan starts the jobs (ties and jobs it does not
  start by the policy's own order).
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections import defaultdict
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from functools import partial

from django.db.models import Q
from django.utils import timezone

from apps.admission import fit
from apps.jobs.models import AttemptState, Job, JobAttempt, JobState
from apps.scheduling.core import policy, waiting
from apps.scheduling.core.calibrate import Calibrated, Calibrator
from apps.scheduling.core.forecast import (
    MIN_RUNS,
    QUANTILES,
    Plan,
    beyond_history,
    forecast,
    typical,
)
from apps.scheduling.kept import ClusterSnapshot

log = logging.getLogger(__name__)

PLAN_SECONDS = 30.0  # made again at least this often while jobs wait
MIN_SECONDS = 1.0  # and at most this often
PLAN_JOBS = 300  # queued jobs planned (the first in queue order); the rest get none
MAX_EVENTS = 80  # policy passes per forecast
HISTORY_DAYS = 30
HISTORY_ROWS = 5000


class Predictor:
    """Runtimes from history, per (user, template); a command job's template is None."""

    def __init__(self, runs: dict[tuple, list[float]], of_template: dict, limits: dict):
        self.runs, self.of_template, self.limits = runs, of_template, limits

    @classmethod
    def load(cls, jobs: list[tuple[str, int, int | None, float]]) -> Predictor:
        """`jobs`: (job id, user id, template id, max_runtime_seconds) of every job planned."""
        users = {user for _, user, _, _ in jobs}
        templates = {template for _, _, template, _ in jobs if template is not None}
        since = timezone.now() - timedelta(days=HISTORY_DAYS)
        rows = (
            JobAttempt.objects.filter(
                Q(job__template_id__in=templates) | Q(job__user_id__in=users),
                state=AttemptState.SUCCEEDED,
                ended_at__gte=since,
                started_at__isnull=False,
            )
            .order_by("-ended_at")
            .values_list("job__user_id", "job__template_id", "started_at", "ended_at")[
                :HISTORY_ROWS
            ]
        )
        runs: dict[tuple, list[float]] = defaultdict(list)
        of_template: dict[int | None, list[float]] = defaultdict(list)
        for user, template, started, ended in rows:
            if started is None or ended is None:
                continue
            seconds = max(0.0, (ended - started).total_seconds())
            if len(runs[user, template]) < 50:
                runs[user, template].append(seconds)
            if template is not None and len(of_template[template]) < 50:
                of_template[template].append(seconds)
        for samples in (*runs.values(), *of_template.values()):
            samples.sort()
        limits = {job: float(limit) for job, _, _, limit in jobs}
        return cls(dict(runs), dict(of_template), limits)

    @classmethod
    def of_runs(cls, found: dict[tuple[int, int | None], list[float]]) -> Predictor:
        """From the run lengths the dispatcher's kept usage holds (kept.Kept.runs), latest first."""
        runs = {kind: sorted(lengths[:50]) for kind, lengths in found.items()}
        merged: dict[int | None, list[float]] = defaultdict(list)
        for (_, template), lengths in found.items():
            if template is not None:
                merged[template].extend(lengths[:50])
        of_template = {template: sorted(lengths) for template, lengths in merged.items()}
        return cls(runs, of_template, {})

    def samples(self, user: int, template: int | None) -> list[float]:
        mine = self.runs.get((user, template), [])
        if len(mine) >= MIN_RUNS:
            return mine
        theirs = self.of_template.get(template, []) if template is not None else []
        return theirs if len(theirs) >= MIN_RUNS else []

    def runtime(self, q: float, user: int, template: int | None, limit: float) -> float:
        samples = self.samples(user, template)
        if not samples:
            return limit if q >= 0.5 else limit * 0.25
        return min(limit, typical(samples, q))

    def remaining(
        self, q: float, user: int, template: int | None, limit: float, elapsed: float
    ) -> float:
        """How much longer a job that has run `elapsed` seconds runs, at quantile q."""
        samples = self.samples(user, template)
        longer = [s for s in samples if s > elapsed]
        left = max(0.0, limit - elapsed)
        if not samples:  # no history: to its limit (a quarter of what is left, early)
            return left if q >= 0.5 else left * 0.25
        if not longer:  # it outlived its history: about as long again, within its limit
            return min(left, beyond_history(q, elapsed))
        return max(0.0, min(limit, typical(longer, q)) - elapsed)


@dataclass
class Estimate:
    start: datetime | None
    earliest: datetime | None
    latest: datetime | None
    position: int | None
    node_ready: datetime | None = None  # it starts on a node being added, ready then

    def same(self, other: Estimate | None) -> bool:
        """Equal but for under a second (a replanned estimate that did not move is not
        written again)."""
        if other is None or self.position != other.position:
            return False
        pairs = [(self.start, other.start), (self.earliest, other.earliest),
                 (self.latest, other.latest)]  # fmt: skip
        for a, b in pairs:
            if (a is None) != (b is None) or (a and b and abs((a - b).total_seconds()) >= 1):
                return False
        return True


@dataclass
class Planner:
    """One per dispatcher process: the last plan, what it was made from, what was written."""

    estimates: dict[str, Estimate] = field(default_factory=dict)
    written: dict[str, Estimate] = field(default_factory=dict)
    key: object = None
    made_at: float = -math.inf
    lock: threading.Lock = field(default_factory=threading.Lock)
    calibrator: Calibrator = field(default_factory=Calibrator)

    def due(self, key: object) -> bool:
        since = time.monotonic() - self.made_at
        return since >= MIN_SECONDS and (key != self.key or since >= PLAN_SECONDS)

    def make(self, now: datetime, jobs: dict[str, Job], snapshot: ClusterSnapshot,
             queued: list[policy.QueuedJob], tiers, usage, config, held,
             arriving: list[policy.ArrivingNode], facts: dict | None = None,
             history: dict | None = None) -> None:  # fmt: skip
        """Plan, if due, from the pass's inputs (before `decide` changes the cluster). `facts`:
        the running jobs' (user, template, limit) as the kept state read them; `history`: the run
        lengths of its usage window (kept.Kept.runs)."""
        key = (
            frozenset(job.job_id for job in queued),
            frozenset(r.job_id for r in snapshot.running),
            tuple((a.ready_at, a.gpu_model, a.gpus) for a in arriving),
        )
        if not queued or not self.due(key):
            if not queued:
                self.estimates = {}
            return
        started = time.monotonic()
        levels = {name: tier.level for name, tier in tiers.items()}
        queued = sorted(queued, key=lambda j: (-levels.get(j.tier, 0), j.submit))[:PLAN_JOBS]
        planned = [job for job in queued if job.job_id in jobs]
        at = now.timestamp()
        self._learn(jobs, snapshot, facts or {})
        predictor = self._predictor_for(jobs, history)

        def end_of(job: policy.RunningJob, q: float) -> float:
            about = self._about.get(_key(job.job_id))
            if about is None:  # GPUs held by no job the database knows: as the policy sees them
                return job.est_end
            user, template, limit, began = about
            return at + predictor.remaining(q, user, template, limit, max(0.0, at - began))

        def runtime_of(job: policy.QueuedJob, q: float) -> float:
            row = jobs.get(job.job_id)
            if row is None:
                return job.est_runtime_s
            return predictor.runtime(
                q, row.user_id, row.template_id, float(row.max_runtime_seconds)
            )

        runs: list[Plan] = [
            forecast(
                at,
                snapshot.cluster,
                planned,
                snapshot.running,
                tiers,
                usage,
                config=config,
                held_reservation=held,
                arriving=arriving,
                end_of=partial(end_of, q=q),
                runtime_of=partial(runtime_of, q=q),
                max_events=MAX_EVENTS,
            )  # fmt: skip
            for q in QUANTILES
        ]
        self._calibrate(at, runs[1], planned, snapshot)
        self.estimates = self._estimates(at, runs, planned)
        self.key, self.made_at = key, time.monotonic()
        log.debug("plan: %d jobs in %.3fs", len(planned), self.made_at - started)

    # Each job's user, template and limit (from the queued rows a pass reads, else one read for
    # the running jobs it did not see queued), and the running jobs' starts (epoch), per plan.
    _facts: dict[str, tuple[int, int | None, float]] = field(default_factory=dict)
    _about: dict[str, tuple[int, int | None, float, float]] = field(default_factory=dict)
    _predictor: Predictor | None = None
    _predictor_at: float = -math.inf
    _predicted: frozenset = frozenset()
    _first: dict[str, Calibrated] = field(default_factory=dict)  # each job's first calibrated

    def _learn(self, jobs: dict[str, Job], snapshot: ClusterSnapshot, facts: dict) -> None:
        for job_id, known in facts.items():
            self._facts[_key(job_id)] = known
        for job_id, job in jobs.items():
            self._facts[_key(job_id)] = (
                job.user_id,
                job.template_id,
                float(job.max_runtime_seconds),
            )
        missing = [r.job_id for r in snapshot.running if _key(r.job_id) not in self._facts]
        missing = [job_id for job_id in missing if _is_id(job_id)]
        if missing:
            for pk, user, template, limit in Job.objects.filter(pk__in=missing).values_list(
                "pk", "user_id", "template_id", "max_runtime_seconds"
            ):
                self._facts[_key(str(pk))] = (user, template, float(limit))
        self._about = {
            _key(r.job_id): (*self._facts[_key(r.job_id)], r.started_at)
            for r in snapshot.running
            if _key(r.job_id) in self._facts
        }
        if len(self._facts) > 8 * PLAN_JOBS:  # forget the jobs that are gone
            keep = {_key(job_id) for job_id in jobs} | set(self._about)
            self._facts = {k: v for k, v in self._facts.items() if k in keep}

    def _predictor_for(self, jobs: dict[str, Job], runs: dict | None = None) -> Predictor:
        """From the run lengths the pass's kept usage holds (no read); without them the history
        is read, again every PLAN_SECONDS or when a job of a new user or template is planned."""
        if runs is not None:
            return Predictor.of_runs(runs)
        kinds = frozenset((user, template) for user, template, _ in self._facts.values())
        stale = time.monotonic() - self._predictor_at > PLAN_SECONDS
        if self._predictor is None or stale or not kinds <= self._predicted:
            rows = [(job_id, *facts) for job_id, facts in self._facts.items()]
            self._predictor = Predictor.load(rows)
            self._predictor_at, self._predicted = time.monotonic(), kinds
        return self._predictor

    def _calibrate(self, at: float, middle: Plan, planned: list[policy.QueuedJob],
                   snapshot: ClusterSnapshot) -> None:  # fmt: skip
        """Teach the calibrator: the planned jobs that started since (their first plan against
        their start), forget those that left the queue unstarted; note the new ones' plans."""
        running = {_key(r.job_id): r.started_at for r in snapshot.running}
        queued = {_key(job.job_id) for job in planned}
        for job_id in self.calibrator.open_jobs():
            if job_id in running:
                self.calibrator.started(job_id, running[job_id])
            elif job_id not in queued:
                self.calibrator.forget(job_id)
        for job in planned:
            start = middle.starts.get(job.job_id)
            if start is not None:
                self.calibrator.planned(_key(job.job_id), job.tier, at, start)

    def _estimates(
        self, at: float, runs: list[Plan], planned: list[policy.QueuedJob]
    ) -> dict[str, Estimate]:
        """Each planned job's estimate: the calibrated start and window where the calibrator has
        the history (core/calibrate.py), else the median run and the three runs' spread."""
        early, middle, late = runs
        tier_of = {job.job_id: job.tier for job in planned}
        self._first = {k: v for k, v in self._first.items() if k in tier_of}
        order = {job_id: i for i, job_id in enumerate(middle.order)}
        ranked = sorted(
            (job.job_id for job in planned),
            key=lambda j: (middle.starts.get(j, math.inf), order.get(j, math.inf)),
        )
        out = {}
        for position, job_id in enumerate(ranked, 1):
            start = middle.starts.get(job_id)
            if start is None:
                out[job_id] = Estimate(None, None, None, position)
                continue
            seen = [run.starts[job_id] for run in runs if job_id in run.starts]
            earliest, latest = min(seen), max(seen) if job_id in late.starts else None
            ready = middle.on_new_node.get(job_id)
            first = self._first.get(job_id)
            if first is None and ready is None:
                first = self.calibrator.estimate(tier_of[job_id], at, start)
                if first is not None:
                    self._first[job_id] = first
            if first is not None and ready is None:
                # The first calibrated estimate stands while the plan is not later than it (so
                # it does not move with the clock); a later plan is news and moves it.
                start = max(start, first.start, at)
                earliest = max(at, min(first.earliest, start))
                latest = max(first.latest, start)
            out[job_id] = Estimate(_dt(start), _dt(earliest), _dt(latest) if latest else None,
                                   position, _dt(ready) if ready else None)  # fmt: skip
        return out

    def changed(self, job: Job) -> Estimate | None:
        """The job's estimate when it differs from what was stored (then written with its
        reason: apps/scheduling/dispatcher.py `_write_reasons`), else None."""
        estimate = self.estimates.get(str(job.pk))
        if estimate is None or estimate.same(self.written.get(str(job.pk))):
            return None
        return estimate

    def stored(self, job: Job, estimate: Estimate, at: datetime) -> None:
        job.planned_start_at, job.planned_start_earliest = estimate.start, estimate.earliest
        job.planned_start_latest, job.planned_position = estimate.latest, estimate.position
        job.planned_at = at
        self.written[str(job.pk)] = estimate
        if len(self.written) > 4 * PLAN_JOBS:  # the jobs that left the queue
            self.written = {k: v for k, v in self.written.items() if k in self.estimates}

    def worded(self, job: Job, reason: str) -> str:
        """The pass's reason for a waiting job, in agreement with its estimate."""
        estimate = self.estimates.get(str(job.pk))
        if estimate is None or estimate.start is None:
            if not reason.startswith("needs "):  # the policy's "more than the cluster can offer"
                return reason
            states = fit.only_unready(fit.shapes(), gpus=job.gpus,
                                      sku=job.gpu_sku.name if job.gpu_sku else None,
                                      selector=job.node_selector or {})  # fmt: skip
            if states:
                return f"only a {states} node could run it: waiting for one to take work again"
            return reason
        if estimate.node_ready is not None:
            return (
                f"waiting for a node being added: ready at {waiting.iso(estimate.node_ready)}; "
                f"expected to start {waiting.iso(estimate.start)}"
            )
        said = f"; expected to start {waiting.iso(estimate.start)}"
        if len(reason) + len(said) > REASON_MAX:
            reason = reason[: REASON_MAX - len(said) - 3] + "..."
        return reason + said


PLANNER = Planner()
REASON_MAX = 300  # Job.reason's length


def _dt(epoch: float) -> datetime:
    return datetime.fromtimestamp(epoch, tz=UTC)


def _key(job_id: str) -> str:
    """A job id as the plan keys it: the kept state may give a UUID with or without dashes."""
    return job_id.replace("-", "")


def _is_id(text: str) -> bool:
    return len(text) >= 32 and all(c in "0123456789abcdef-" for c in text)


__all__ = ["PLANNER", "Estimate", "Planner", "Predictor", "JobState"]


def forget() -> None:
    """A new planner (tests: each starts with no plan made or written)."""
    global PLANNER
    PLANNER = Planner()
