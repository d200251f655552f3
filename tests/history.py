"""A long history for the plans of the dispatcher's reads: many ended attempts (each with its
job and its released GPU), a few hundred running ones on GPUs of their own, ANALYZE'd
(tests/scheduling_indexes_test and bench._history_reads)."""

from __future__ import annotations

import uuid
from datetime import timedelta

from django.db import connection
from django.utils import timezone

from apps.jobs.models import (
    AttemptMember,
    AttemptState,
    GpuAllocation,
    Job,
    JobAttempt,
    JobState,
)
from apps.nodes.models import Gpu
from apps.tenants.models import Membership
from tests.factories import fast_insert, make_node

SPREAD = timedelta(days=60)  # the ended attempts' ends, evenly over this much of the past
RUN = timedelta(minutes=10)  # each ended attempt's length


def seed_history(ended: int, live: int, username: str = "bob") -> None:
    """`ended` succeeded jobs and attempts, ended evenly over the last `SPREAD`, and `live`
    running ones (one GPU and one member each, on nodes of 8 made for them), as `username`'s; then ANALYZE."""
    member = Membership.objects.select_related("tenant").get(user__username=username)
    for n in range(-(-live // 8)):
        make_node(f"history-{n}", gpus=8)
    gpus = list(Gpu.objects.filter(node__name__startswith="history-").values_list("pk", flat=True))
    now = timezone.now()
    ids = [uuid.uuid4() for _ in range(ended + live)]

    def end_of(i: int):
        return now - SPREAD + SPREAD * (i + 1) / (ended + 1)

    def job(i: int) -> dict:
        done = i < ended
        return {"id": ids[i], "state": JobState.SUCCEEDED if done else JobState.RUNNING,
                "created_at": end_of(i) - RUN if done else now}  # fmt: skip

    fast_insert(Job, ended + live, job, name="history", tenant=member.tenant, user=member.user,
                tier=member.tenant.tier, command=["true"], attempts_count=1)  # fmt: skip

    def attempt(i: int) -> dict:
        if i < ended:
            return {"job_id": ids[i], "state": AttemptState.SUCCEEDED, "exit_code": 0,
                    "started_at": end_of(i) - RUN, "ended_at": end_of(i)}  # fmt: skip
        return {"job_id": ids[i], "state": AttemptState.RUNNING, "started_at": now - RUN,
                "lease_expires_at": now + timedelta(hours=1)}  # fmt: skip

    fast_insert(JobAttempt, ended + live, attempt, number=1, created_at=now)
    attempts = list(JobAttempt.objects.filter(job_id__in=ids[ended:]).values_list("pk", flat=True))
    first = JobAttempt.objects.filter(job_id=ids[0]).values_list("pk", flat=True).get()

    def allocation(i: int) -> dict:
        if i < ended:
            return {"attempt_id": first + i, "gpu_id": gpus[i % len(gpus)],
                    "allocated_at": end_of(i) - RUN, "released_at": end_of(i)}  # fmt: skip
        return {"attempt_id": attempts[i - ended], "gpu_id": gpus[i - ended]}

    fast_insert(GpuAllocation, ended + live, allocation, attempt_id=first, gpu_id=gpus[0])
    nodes = dict(Gpu.objects.filter(pk__in=gpus).values_list("pk", "node_id"))

    def member(i: int) -> dict:
        at = allocation(i)
        return {"attempt_id": at["attempt_id"], "node_id": nodes[at["gpu_id"]],
                **({"state": AttemptState.SUCCEEDED, "ended_at": at["released_at"]}
                   if i < ended else {"state": AttemptState.RUNNING})}  # fmt: skip

    fast_insert(AttemptMember, ended + live, member, attempt_id=first, node_id=nodes[gpus[0]])
    analyze()


def analyze() -> None:
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE")
