"""The dispatcher's reads against a long history: which scan a whole table, and what the pass's
history reads (and an attempt's end) cost with and without the attempts' indexes.

    python -m bench._history_reads [--ended 200000] [--live 300] [--explain] [--rounds 3]

A fresh database (bench._in_process) seeded by tests.history (`--ended` ended attempts, `--live`
running ones, ANALYZE'd). `--explain`: runs two dispatcher passes (a full read and a kept one),
a pass after an attempt ended, a reconcile tick and a heartbeat's lease renewal, and prints
every statement of them whose plan reads a whole attempts, jobs, allocations or members table,
with its plan (SQLite: EXPLAIN QUERY PLAN's lines, a partial index's whole scan among them).
Then the timing: in `--rounds` rounds, the indexes of JobAttempt.Meta.indexes (apps/jobs)
dropped and made again in turn, the medians in ms of 50 of each: a pass's history reads (the
stamps, the running ids, the recent ends: apps/scheduling/kept.py), a dispatcher pass (the
queue empty: the kept state's reads), and 100 running attempts ended (a statement each, rolled
back: what the index costs a write); one line per round and variant.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

from bench._in_process import django_in_process

SEQ_TABLES = ("jobs_jobattempt", "jobs_job", "jobs_gpuallocation", "jobs_attemptmember")


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--ended", type=int, default=200_000)
    parser.add_argument("--live", type=int, default=300)
    parser.add_argument("--explain", action="store_true")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    with django_in_process():
        from django.db import connection

        from tests.history import seed_history

        started = time.monotonic()
        seed_history(args.ended, args.live)
        print(f"seeded {args.ended} ended + {args.live} running in {time.monotonic() - started:.0f} s "
              f"({connection.vendor})")  # fmt: skip
        if args.explain:
            explain_pass()
        for round_ in range(args.rounds):
            for indexed in (False, True):
                set_indexes(indexed)
                times = time_reads()
                print(f"round {round_} {'with' if indexed else 'without'} indexes: "
                      + ", ".join(f"{k} {v:.2f}" for k, v in times.items()))  # fmt: skip
    return 0


def explain_pass() -> None:
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from apps.jobs.handlers import renew_leases
    from apps.jobs.models import AttemptMember, AttemptState, JobAttempt
    from apps.platform import events
    from apps.scheduling import dispatcher, reconcile

    with CaptureQueriesContext(connection) as captured:
        dispatcher.dispatch_once()
        dispatcher.dispatch_once()
        # One attempt ends (as a report would leave it): the next pass reads the moved ones.
        from django.utils import timezone

        pk = JobAttempt.objects.filter(ended_at=None).values_list("pk", flat=True).first()
        JobAttempt.objects.filter(pk=pk).update(
            state=AttemptState.SUCCEEDED, ended_at=timezone.now()
        )
        dispatcher.dispatch_once()
        reconcile.reconcile_once()
        # A node's heartbeat renews its running attempts' leases.
        node = AttemptMember.objects.filter(ended_at=None).values_list("node_id", flat=True)[0]
        renew_leases(events.NodeAlive(node_id=node, lease_until=timezone.now()))
    seen = set()
    for query in captured.captured_queries:
        sql = query["sql"]
        if not sql.lstrip().upper().startswith("SELECT") or sql in seen:
            continue
        seen.add(sql)
        plan = plan_of(sql)
        scans = [line for line in plan if any(f"{scan} {t} " in line + " " for t in SEQ_TABLES
                                              for scan in ("Seq Scan on", "SCAN"))]  # fmt: skip
        if scans:
            print(f"--- {query['time']} s: {sql[:600]}")
            print("\n".join(plan))


def plan_of(sql: str) -> list[str]:
    """PostgreSQL's EXPLAIN, or SQLite's EXPLAIN QUERY PLAN (its last column)."""
    from django.db import connection

    sqlite = connection.vendor == "sqlite"
    with connection.cursor() as cursor:
        cursor.execute(("EXPLAIN QUERY PLAN " if sqlite else "EXPLAIN ") + sql)
        return [str(row[-1]) for row in cursor.fetchall()]


def set_indexes(present: bool) -> None:
    from django.db import connection

    from apps.jobs.models import JobAttempt

    indexes = JobAttempt._meta.indexes
    with connection.cursor() as cursor:
        for index in indexes:
            cursor.execute(f"DROP INDEX IF EXISTS {connection.ops.quote_name(index.name)}")
    if present:
        with connection.schema_editor() as editor:
            for index in indexes:
                editor.add_index(JobAttempt, index)
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE jobs_jobattempt")


def time_reads(reads: int = 50) -> dict[str, float]:
    from datetime import timedelta

    from django.db.models import Q
    from django.utils import timezone

    from apps.jobs.models import JobAttempt
    from apps.scheduling import dispatcher, kept

    after = timezone.now() - timedelta(seconds=5)
    steps = {
        "stamps": lambda: kept.pass_stamps(checkpoints_after=after),
        "running ids": lambda: list(
            kept._usage_rows().filter(ended_at=None).values_list("pk", flat=True)
        ),
        "recent ends": lambda: list(
            kept._usage_rows().filter(Q(ended_at__gte=after) | Q(pk__in=[1, 2]))
            .values_list(*kept._SPAN_FIELDS)
        ),
    }  # fmt: skip
    steps["pass"] = dispatcher.dispatch_once  # a kept pass, the queue empty
    running = list(JobAttempt.objects.filter(ended_at=None).values_list("pk", flat=True)[:100])
    steps["100 ends"] = lambda: end_running(running)
    dispatcher.dispatch_once()
    out = {}
    for name, step in steps.items():
        samples = []
        for _ in range(reads):
            begin = time.perf_counter()
            step()
            samples.append((time.perf_counter() - begin) * 1000)
        out[name] = statistics.median(samples)
    return out


def end_running(ids: list[int]) -> None:
    """The write an index costs: the running attempts `ids` ended, a statement each (as a
    report's move writes its state and end), then rolled back."""
    from django.db import transaction
    from django.utils import timezone

    from apps.jobs.models import AttemptState, JobAttempt

    with transaction.atomic():
        now = timezone.now()
        for pk in ids:
            JobAttempt.objects.filter(pk=pk).update(state=AttemptState.SUCCEEDED, ended_at=now)
        transaction.set_rollback(True)


if __name__ == "__main__":
    sys.exit(main())
