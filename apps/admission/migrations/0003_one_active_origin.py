"""One active origin per cache key, held by the database (issue 36): `CachedJob.active` and a
partial unique index on (tenant, key) of the active origins. The origins whose job is queued or
placed now become active, the oldest of each key where two were (the race this closes); a
younger one runs on as it is, only no longer joined."""

from django.db import migrations, models

ACTIVE_STATES = ("queued", "starting", "running", "preempting")


def mark_active_origins(apps, schema_editor):
    CachedJob = apps.get_model("admission", "CachedJob")
    seen = set()
    origins = CachedJob.objects.filter(role="origin", job__state__in=ACTIVE_STATES)
    for pk, tenant, key in origins.order_by("created_at").values_list("pk", "tenant_id", "key"):
        if (tenant, key) not in seen:
            seen.add((tenant, key))
            CachedJob.objects.filter(pk=pk).update(active=True)


class Migration(migrations.Migration):
    dependencies = [
        ("admission", "0002_queued_count"),
        ("jobs", "0014_array_open_index"),
        ("tenants", "0009_bundle_caps"),
    ]

    operations = [
        migrations.AddField(
            model_name="cachedjob",
            name="active",
            field=models.BooleanField(default=False),
        ),
        migrations.RunPython(mark_active_origins, migrations.RunPython.noop, elidable=True),
        migrations.AddConstraint(
            model_name="cachedjob",
            constraint=models.UniqueConstraint(
                condition=models.Q(("active", True), ("role", "origin")),
                fields=("tenant", "key"),
                name="cache_one_active_origin_per_key",
            ),
        ),
    ]
