"""Which stored checkpoint a member resumes from (the agent API's answer, apps/nodes/agent_api.py).

An attempt's checkpoint (`JobAttempt.checkpoint`) is the name its rank 0 stored last. Each rank
stores its own under `checkpoints/<job>/attempt-<n>/rank-<r>/` (one file: JSON, any bytes, or a
directory packed by the job SDK), so a gang's rank r resumes from its own file of the attempt
rank 0's checkpoint is from (the newest one there), or of the newest earlier attempt where rank 0
and rank r both stored one.
"""

from __future__ import annotations

from django.core.files.storage import default_storage

from apps.jobs.models import JobAttempt


def resume_checkpoints(attempts: list[tuple[int, object, int]]) -> dict[int, str]:
    """`resume_checkpoint` of several attempts, each (attempt id, job id, number), in one query."""
    stored: dict[str, list[tuple[int, str]]] = {}
    if attempts:
        rows = (
            JobAttempt.objects.filter(job_id__in={job for _, job, _ in attempts})
            .exclude(checkpoint="")
            .order_by()  # sorted below: no ORDER BY joining the jobs
        )
        for job, number, name in rows.values_list("job_id", "number", "checkpoint"):
            stored.setdefault(str(job), []).append((number, name))
    answer = {}
    for attempt_id, job_id, number in attempts:
        prefix = f"checkpoints/{job_id}/"
        names = sorted(stored.get(str(job_id), []), reverse=True)
        answer[attempt_id] = next(
            (name for n, name in names if n <= number and name.startswith(prefix)), ""
        )
    return answer


def _stored(attempt: JobAttempt) -> list[str]:
    """The checkpoints rank 0 stored for this attempt's job, in this or an earlier attempt,
    newest attempt first."""
    earlier = JobAttempt.objects.filter(job_id=attempt.job_id, number__lte=attempt.number)
    prefix = f"checkpoints/{attempt.job_id}/"
    names = earlier.exclude(checkpoint="").order_by("-number").values_list("checkpoint", flat=True)
    return [name for name in names if name.startswith(prefix)]


def resume_checkpoint(attempt: JobAttempt) -> str:
    """The stored checkpoint an attempt resumes from: the newest its job stored (any node, this
    or an earlier attempt), or ""."""
    return next(iter(_stored(attempt)), "")


def rank_checkpoint(attempt: JobAttempt, rank: int) -> str:
    """The stored file this rank resumes from, or "" (none, or gone from storage).

    Rank r > 0 takes its own newest file from the newest attempt in which rank 0 stored one and
    rank r did too. Rank 0 of an attempt can start and store before rank r on a busy node asks:
    rank r then still gets what it saved in the attempt before, not nothing."""
    for name in _stored(attempt):
        if rank != 0:
            folder = name.rsplit("/", 2)[0] + f"/rank-{rank}"
            try:
                _, files = default_storage.listdir(folder)
            except FileNotFoundError:
                continue
            if not files:
                continue
            name = max(
                (f"{folder}/{file}" for file in files), key=default_storage.get_modified_time
            )
        return name if default_storage.exists(name) else ""
    return ""
