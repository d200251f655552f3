"""The dispatcher's reads of the attempts go through indexes, not through every attempt ever
made: a pass must cost what runs, not the history (docs/bench/71-slurm-peer-notes.md,
"h37index pass"). The plans are those of the statements as sent, parameters and all: SQLite
plans a statement before it sees its parameters."""

import re

import pytest
from django.db import connection
from django.utils import timezone

from apps.jobs.models import AttemptState, JobAttempt
from apps.scheduling import dispatcher, kept
from tests.factories import make_cast
from tests.history import seed_history

# The tables that grow with the history (a row or more per job ever run), and the aliases a
# statement of ours or Django's (a subquery's U0, U1...) gives them.
HISTORY_TABLES = {"jobs_job", "jobs_jobattempt", "jobs_gpuallocation", "jobs_attemptmember",
                  "jobs_jobevent", "g", "a", "j"}  # fmt: skip


@pytest.fixture
def history(db):
    make_cast()
    seed_history(ended=20_000, live=40)
    kept.KEPT.forget()
    yield
    kept.KEPT.forget()


def plan_of(sql: str, params) -> list[str]:
    sqlite = connection.vendor == "sqlite"
    with connection.cursor() as cursor:
        cursor.execute(("EXPLAIN QUERY PLAN " if sqlite else "EXPLAIN ") + sql, params)
        return [str(row[-1]) for row in cursor.fetchall()]


def whole_table_reads(plan: list[str]) -> list[str]:
    """A table read whole: PostgreSQL's Seq Scan, SQLite's SCAN without an index."""
    found = []
    for line in plan:
        match = re.search(r"Seq Scan on (\w+)", line) or re.fullmatch(r"SCAN (\w+)", line.strip())
        if match and (match[1] in HISTORY_TABLES or re.fullmatch(r"U\d+", match[1])):
            found.append(line.strip())
    return found


def test_a_kept_pass_reads_no_whole_history_table(history):
    """After the first pass (a full read, and the usage's read of its window), a pass and a pass
    after an attempt ended read the attempts, jobs, allocations and members only through
    indexes: the running ones and those that ended since through jobs_attempt_ended_idx."""
    sent = []

    def record(execute, sql, params, many, context):
        if sql.lstrip().upper().startswith("SELECT"):
            sent.append((sql, params))
        return execute(sql, params, many, context)

    dispatcher.dispatch_once()
    with connection.execute_wrapper(record):
        dispatcher.dispatch_once()
        pk = JobAttempt.objects.filter(ended_at=None).values_list("pk", flat=True).first()
        JobAttempt.objects.filter(pk=pk).update(
            state=AttemptState.SUCCEEDED, ended_at=timezone.now()
        )
        dispatcher.dispatch_once()
    plans = [(sql, plan_of(sql, params)) for sql, params in sent]
    assert [
        (sql[:300], whole_table_reads(plan)) for sql, plan in plans if whole_table_reads(plan)
    ] == []
    through = [sql for sql, plan in plans if any("jobs_attempt_ended_idx" in line for line in plan)]
    # The stamps (each pass), the running ids and the recent ends with the moved attempts.
    assert any("MAX(started_at)" in sql for sql in through)
    assert any(re.search(r'"ended_at" IS NULL', sql) for sql in through)
    assert any('"ended_at" >=' in sql for sql in through)
