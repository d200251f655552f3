"""A job array's `%N`: at most N of its tasks placed at once (starting, running or preempting:
each holds GPUs). Part of the dispatcher's admission view (quotas.DispatchGate): a task over its
array's throttle waits, with a reason that says so, and a start in the pass counts at once, so
two tasks placed in one pass cannot together pass N."""

from __future__ import annotations

from dataclasses import dataclass, field

from django.db.models import Count

from apps.jobs.models import JOB_PLACED, Job, JobArray


@dataclass
class ArrayThrottle:
    limits: dict = field(default_factory=dict)  # array id -> N, for throttled open arrays
    placed: dict = field(default_factory=dict)  # array id -> its tasks placed now

    @classmethod
    def load(cls) -> ArrayThrottle:
        limits = dict(
            JobArray.objects.filter(ended_at=None, throttle__isnull=False).values_list(
                "pk", "throttle"
            )
        )
        if not limits:
            return cls()
        placed = dict(
            Job.objects.filter(array_id__in=list(limits), state__in=JOB_PLACED)
            .values_list("array_id")
            .annotate(n=Count("pk"))
            .order_by()
        )
        return cls(limits=limits, placed=placed)

    def hold_reason(self, job: Job) -> str | None:
        limit = self.limits.get(job.array_id) if job.array_id is not None else None
        if limit is None:
            return None
        placed = self.placed.get(job.array_id, 0)
        if placed >= limit:
            return f"array {job.array_id}: {placed} of its %{limit} tasks placed"
        return None

    def count(self, job: Job) -> None:
        if job.array_id in self.limits:
            self.placed[job.array_id] = self.placed.get(job.array_id, 0) + 1
