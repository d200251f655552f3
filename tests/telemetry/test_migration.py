"""Migration telemetry 0002: the points of a series' JSON list become GpuPoint rows, and back."""

import pytest
from django.db import connection
from django.db.migrations.executor import MigrationExecutor

from tests.unit.test_dispatcher import dispatch_once, submit

BEFORE = [("telemetry", "0001_gpu_series_and_summary")]
AFTER = [("telemetry", "0002_gpu_points")]


def migrate(targets):
    executor = MigrationExecutor(connection)
    executor.loader.build_graph()
    executor.migrate(targets)
    return executor.loader.project_state(targets).apps


@pytest.mark.django_db(transaction=True)
def test_json_points_become_rows_and_go_back(cast):
    from tests.factories import make_node

    make_node("h1", gpus=1)
    job = submit(cast, "bob", gpus=1)
    dispatch_once()
    attempt_id = job.attempts.get().pk
    points = [[1000.0 + i, 10.0 * i, 100 + i, 1.0] for i in range(3)]
    try:
        apps = migrate(BEFORE)
        old_series = apps.get_model("telemetry", "GpuSeries")
        old_series.objects.create(job_id=job.pk, attempt_id=attempt_id, node="h1", gpu_index=0,
                                  points=points, last_t=1002.0)  # fmt: skip
        apps = migrate(AFTER)
        series = apps.get_model("telemetry", "GpuSeries").objects.get()
        rows = apps.get_model("telemetry", "GpuPoint").objects.filter(series=series).order_by("t")
        assert [list(r) for r in rows.values_list("t", "util", "memory_mib", "seconds")] == points
        assert series.point_count == 3
        apps = migrate(BEFORE)
        assert apps.get_model("telemetry", "GpuSeries").objects.get().points == points
    finally:
        migrate(AFTER)
