"""PostgreSQL: `gpuplatform_queue_room(tenant, wanted, cap)`, the queued-job cap's lock and count
as one function, so that a submit's check and inserts are one statement (apps/admission/rows.py,
"the queued-job cap"). It takes the tenant's count row lock first and counts after it: each
statement of a VOLATILE function takes a fresh snapshot, so the count sees what the submit it
waited for committed (its array's virtual tasks), as the separate lock statement before it did.
One statement can be a prepared statement, which a query string of two cannot: the server then
plans the submit's insert once per connection (docs/bench/71-slurm-peer-notes.md, h36pg pass).

SQLite has no functions of this kind and needs none (its submit's transaction holds the one
write lock): nothing there."""

from django.db import migrations

CREATE = """
CREATE OR REPLACE FUNCTION gpuplatform_queue_room(of_tenant bigint, wanted integer, cap integer)
RETURNS TABLE (queued_jobs integer, virtual_tasks bigint, has_room boolean)
LANGUAGE plpgsql VOLATILE AS $$
BEGIN
    PERFORM 1 FROM admission_queuedcount WHERE tenant_id = of_tenant FOR UPDATE;
    RETURN QUERY
    SELECT c.queued, v.tasks, c.queued + v.tasks + wanted <= cap
    FROM admission_queuedcount c, (
        SELECT COALESCE(SUM(a.size - a.materialised), 0)::bigint AS tasks FROM jobs_jobarray a
        WHERE a.tenant_id = of_tenant AND a.cancelled_at IS NULL AND a.failed_reason = ''
        AND a.materialised < a.size
    ) v
    WHERE c.tenant_id = of_tenant;
END $$
"""
DROP = "DROP FUNCTION IF EXISTS gpuplatform_queue_room(bigint, integer, integer)"


def _on_postgresql(sql: str):
    def run(apps, schema_editor):
        if schema_editor.connection.vendor == "postgresql":
            schema_editor.execute(sql)

    return run


class Migration(migrations.Migration):
    dependencies = [
        ("admission", "0003_one_active_origin"),
        ("jobs", "0018_job_start_plan"),
    ]

    operations = [migrations.RunPython(_on_postgresql(CREATE), _on_postgresql(DROP))]
