"""PostgreSQL: the indexes the dispatcher's queue heads are read through
(apps/scheduling/dispatcher.py `ordered_queue`). Each (tier, tenant, pool) queue's first jobs by
submit time are read by walking this index: one index probe per queue for its key and one short
range scan for its heads, instead of numbering every queued row in a window (a sort of the whole
queue: 0.2-0.26 s at 50,000 queued, against 4-8 ms through the index; docs/scheduling.md). The
second index holds the few queued jobs with a priority boost, which are handed over whatever
their place. Partial (queued jobs only), so a job's row leaves them when it starts.

The node selector is keyed by the MD5 of its text (jsonb's text is canonical: the same labels,
the same text): a selector itself may be up to 32 labels of 63 + 63 characters, more than a
B-tree entry may hold (2,704 bytes), and an index on it would refuse such a job's insert.

Built CONCURRENTLY (so outside a transaction: `atomic = False`): on an installation with a long
queue the build does not block its submits and the dispatcher's writes meanwhile.

SQLite keeps the window (no LATERAL there) and gets neither index: each would only cost its
submits an insert more.
"""

from django.db import migrations

HEADS = (
    "CREATE INDEX CONCURRENTLY IF NOT EXISTS jobs_job_queue_heads_idx ON jobs_job "
    "(tier_id, tenant_id, (COALESCE(gpu_sku_id, 0)), (md5(node_selector::text)), "
    "((command IS NOT NULL)), created_at, id) WHERE state = 'queued'"
)
BOOSTED = (
    "CREATE INDEX CONCURRENTLY IF NOT EXISTS jobs_job_queue_boosted_idx ON jobs_job (created_at) "
    "WHERE state = 'queued' AND priority_boost <> 0"
)


def create(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(HEADS)
        schema_editor.execute(BOOSTED)


def drop(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute("DROP INDEX CONCURRENTLY IF EXISTS jobs_job_queue_heads_idx")
        schema_editor.execute("DROP INDEX CONCURRENTLY IF EXISTS jobs_job_queue_boosted_idx")


class Migration(migrations.Migration):
    atomic = False
    dependencies = [
        ("jobs", "0012_job_dependencies"),
    ]

    operations = [migrations.RunPython(create, drop)]
