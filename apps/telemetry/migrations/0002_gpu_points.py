"""A GPU series' points move from one JSON list (rewritten whole at every heartbeat) to a row
each (GpuPoint): a heartbeat appends its samples (apps/telemetry/series.py)."""

import django.db.models.deletion
from django.db import migrations, models


def points_to_rows(apps, schema_editor):
    series_model = apps.get_model("telemetry", "GpuSeries")
    point_model = apps.get_model("telemetry", "GpuPoint")
    for series in series_model.objects.iterator():
        point_model.objects.bulk_create(
            point_model(series=series, t=t, util=util, memory_mib=memory, seconds=seconds)
            for t, util, memory, seconds in series.points_json
        )
        series_model.objects.filter(pk=series.pk).update(point_count=len(series.points_json))


def rows_to_points(apps, schema_editor):
    series_model = apps.get_model("telemetry", "GpuSeries")
    point_model = apps.get_model("telemetry", "GpuPoint")
    for series in series_model.objects.iterator():
        rows = point_model.objects.filter(series=series).order_by("t")
        points = [list(p) for p in rows.values_list("t", "util", "memory_mib", "seconds")]
        series_model.objects.filter(pk=series.pk).update(points_json=points)


class Migration(migrations.Migration):
    dependencies = [
        ("telemetry", "0001_gpu_series_and_summary"),
    ]

    operations = [
        # (renamed first: the points' rows are `points` on a series, as the list was)
        migrations.RenameField(model_name="gpuseries", old_name="points", new_name="points_json"),
        migrations.AddField(
            model_name="gpuseries",
            name="point_count",
            field=models.PositiveIntegerField(default=0),
        ),
        migrations.CreateModel(
            name="GpuPoint",
            fields=[
                (
                    "id",
                    models.BigAutoField(
                        auto_created=True, primary_key=True, serialize=False, verbose_name="ID"
                    ),
                ),
                ("t", models.FloatField()),
                ("util", models.FloatField()),
                ("memory_mib", models.PositiveIntegerField()),
                ("seconds", models.FloatField()),
                (
                    "series",
                    models.ForeignKey(
                        on_delete=django.db.models.deletion.CASCADE,
                        related_name="points",
                        to="telemetry.gpuseries",
                    ),
                ),
            ],
            options={
                "indexes": [models.Index(fields=["series", "t"], name="gpu_point_series_t")],
            },
        ),
        migrations.RunPython(points_to_rows, rows_to_points),
        migrations.RemoveField(model_name="gpuseries", name="points_json"),
    ]
