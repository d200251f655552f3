"""The Celery app: configuration from Django settings (CELERY_*), routes and the beat schedule."""

import os

from celery import Celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "gpuplatform.settings")

app = Celery("gpuplatform")
app.config_from_object("django.conf:settings", namespace="CELERY")
# Node tasks (workers/tasks.py) live on the agents' own app (workers/celery_app.py), sent by name.
app.autodiscover_tasks(["apps.scheduling", "apps.webhooks", "apps.bundles", "apps.telemetry"])
app.autodiscover_tasks(["apps.scheduling"], related_name="autoscaling")


@app.on_after_finalize.connect
def _beat_schedule(sender, **kwargs):
    from apps.scheduling.schedule import beat_schedule

    sender.conf.beat_schedule = beat_schedule()
