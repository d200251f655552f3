"""Each tenant's count of queued jobs, kept by the database itself.

The queued-job cap used to count the tenant's queue on every submit, under the lock that makes
the cap exact: a statement that grew with the queue (on PostgreSQL every fresh row of it was
also a heap visit, the visibility map not yet knowing it), and one round trip more while the
lock was held. Here triggers on the jobs table keep `QueuedCount` in the same transaction as
each insert, state change or delete that moves a job into or out of `queued`, so every path
(submit, dispatcher, cancel, requeue, preemption, the admin, raw SQL) keeps it exact without
knowing about it. Reads are one row; the whole queue's length is one row per tenant.

The triggers are installed after every `migrate` (post_migrate, `install`), not by a
migration: on SQLite, Django alters a table by building a new one and dropping the old, and
the old one's triggers go with it. When any trigger was missing, the counts are taken again
from the jobs table in the same transaction, with the table locked against writers.
`python manage.py queued_counts` checks them against a count of the queue (and `--fix`
repairs them).
"""

from __future__ import annotations

from django.db import connection, transaction
from django.db.models import Count

from apps.jobs.models import Job, JobState

PREFIX = (
    "gpuplatform_queued_count"  # the triggers' (and PostgreSQL's function's) names start with it
)


def _names() -> dict:
    from apps.admission.models import QueuedCount

    q = connection.ops.quote_name
    return {
        "jobs": q(Job._meta.db_table),
        "state": q(Job._meta.get_field("state").column),
        "tenant": q(Job._meta.get_field("tenant").column),
        "counts": q(QueuedCount._meta.db_table),
        "count_tenant": q(QueuedCount._meta.get_field("tenant").column),
        "queued": q(QueuedCount._meta.get_field("queued").column),
        "q": f"'{JobState.QUEUED.value}'",
    }


# A job counts in its tenant's row while its state is queued. An update counts when it moves
# the job into or out of the queue, or moves a queued job to another tenant.
_UPDATE_WHEN = "(OLD.{state} = {q}) <> (NEW.{state} = {q}) OR (NEW.{state} = {q} AND OLD.{tenant} <> NEW.{tenant})"


def _sqlite_triggers(n: dict) -> dict[str, str]:
    plus = (
        "INSERT INTO {counts} ({count_tenant}, {queued}) SELECT NEW.{tenant}, 1 WHERE NEW.{state} = {q} "
        "ON CONFLICT ({count_tenant}) DO UPDATE SET {queued} = {queued} + 1;"
    )  # (SQLite's upsert after a SELECT needs its WHERE)
    minus = "UPDATE {counts} SET {queued} = {queued} - 1 WHERE {count_tenant} = OLD.{tenant} AND OLD.{state} = {q};"
    return {
        f"{PREFIX}_insert": f"AFTER INSERT ON {{jobs}} WHEN NEW.{{state}} = {{q}} BEGIN {plus} END",
        f"{PREFIX}_update": f"AFTER UPDATE OF {{state}}, {{tenant}} ON {{jobs}} WHEN {_UPDATE_WHEN} BEGIN {minus} {plus} END",
        f"{PREFIX}_delete": f"AFTER DELETE ON {{jobs}} WHEN OLD.{{state}} = {{q}} BEGIN {minus} END",
    }


def _postgresql_function(n: dict) -> str:
    return (
        f"CREATE OR REPLACE FUNCTION {PREFIX}() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN "
        "IF TG_OP <> 'INSERT' AND OLD.{state} = {q} THEN "
        "UPDATE {counts} SET {queued} = {queued} - 1 WHERE {count_tenant} = OLD.{tenant}; END IF; "
        "IF TG_OP <> 'DELETE' AND NEW.{state} = {q} THEN "
        "INSERT INTO {counts} ({count_tenant}, {queued}) VALUES (NEW.{tenant}, 1) "
        "ON CONFLICT ({count_tenant}) DO UPDATE SET {queued} = {counts}.{queued} + 1; END IF; "
        "RETURN NULL; END $$"
    ).format(**n)


def _postgresql_triggers(n: dict) -> dict[str, str]:
    run = f"FOR EACH ROW WHEN ({{when}}) EXECUTE FUNCTION {PREFIX}()"
    return {
        f"{PREFIX}_insert": "AFTER INSERT ON {jobs} " + run.replace("{when}", "NEW.{state} = {q}"),
        f"{PREFIX}_update": "AFTER UPDATE OF {state}, {tenant} ON {jobs} "
        + run.replace("{when}", _UPDATE_WHEN),
        f"{PREFIX}_delete": "AFTER DELETE ON {jobs} " + run.replace("{when}", "OLD.{state} = {q}"),
    }


def installed() -> set[str]:
    """Names of this module's triggers present on the jobs table."""
    with connection.cursor() as cursor:
        if connection.vendor == "sqlite":
            cursor.execute(
                "SELECT name FROM sqlite_master WHERE type = 'trigger' AND tbl_name = %s",
                [Job._meta.db_table],
            )
        elif connection.vendor == "postgresql":
            cursor.execute("SELECT tgname FROM pg_trigger WHERE tgrelid = %s::regclass AND NOT tgisinternal",
                           [Job._meta.db_table])  # fmt: skip
        else:
            return set()
        return {name for (name,) in cursor.fetchall() if name.startswith(PREFIX)}


def supported() -> bool:
    return connection.vendor in ("sqlite", "postgresql")


def install() -> list[str]:
    """Create the missing triggers; if any was missing, count the queue again. Returns the
    names created. Runs after every migrate (apps.py)."""
    if not supported():
        raise NotImplementedError(
            f"queued-job counts need SQLite or PostgreSQL, not {connection.vendor}"
        )
    n = _names()
    with transaction.atomic():
        if connection.vendor == "postgresql":
            with connection.cursor() as cursor:  # writers wait from here to the commit
                cursor.execute(f"LOCK TABLE {n['jobs']} IN SHARE ROW EXCLUSIVE MODE")
        have = installed()
        wanted = _sqlite_triggers(n) if connection.vendor == "sqlite" else _postgresql_triggers(n)
        missing = [name for name in wanted if name not in have]
        if not missing:
            return []
        with connection.cursor() as cursor:
            if connection.vendor == "postgresql":
                cursor.execute(_postgresql_function(n))
            for name in missing:
                cursor.execute(f"CREATE TRIGGER {name} " + wanted[name].format(**n))
        recount()
    return missing


def recount() -> None:
    """Every tenant's row from a count of the jobs table (inside the caller's transaction)."""
    n = _names()
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":  # writers of jobs wait from here to the commit
            cursor.execute(f"LOCK TABLE {n['jobs']} IN SHARE ROW EXCLUSIVE MODE")
        cursor.execute(f"DELETE FROM {n['counts']}")
        cursor.execute(
            f"INSERT INTO {n['counts']} ({n['count_tenant']}, {n['queued']}) "
            f"SELECT {n['tenant']}, COUNT(*) FROM {n['jobs']} WHERE {n['state']} = %s GROUP BY {n['tenant']}",
            [JobState.QUEUED.value],
        )


def differences() -> dict[int, tuple[int, int]]:
    """{tenant id: (kept, counted)} wherever a row disagrees with a count of the queue."""
    from apps.admission.models import QueuedCount

    kept = dict(QueuedCount.objects.values_list("tenant_id", "queued"))
    queue = Job.objects.filter(state=JobState.QUEUED).values("tenant_id").annotate(n=Count("pk"))
    counted = {row["tenant_id"]: row["n"] for row in queue}
    return {
        tenant: (kept.get(tenant, 0), counted.get(tenant, 0))
        for tenant in set(kept) | set(counted)
        if kept.get(tenant, 0) != counted.get(tenant, 0)
    }
