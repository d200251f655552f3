"""The Celery app: configuration from Django settings (CELERY_*), routes and the beat schedule."""

import logging
import os

from celery import Celery

from apps.platform.names import Task

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


# The ticks the beat sends every few seconds (and the dispatch passes every submit asks for):
# three INFO lines each (sent, received, succeeded), nine in ten of the dispatcher's output.
TICKS = frozenset({Task.DISPATCH, Task.RECONCILE, Task.AUTOSCALE, Task.WEBHOOKS_PUMP})


class QuietTicks(logging.Filter):
    """The ticks' routine lines are logged only when the process logs at DEBUG (LOG_LEVEL or
    `--loglevel DEBUG`); a tick that fails or retries still logs, at its own level."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno != logging.INFO or not _is_tick(record.args):
            return True
        return logging.getLogger().isEnabledFor(logging.DEBUG)


def _is_tick(args) -> bool:
    if isinstance(args, dict):  # "Task %(name)s[%(id)s] received / succeeded ..."
        return args.get("name") in TICKS
    return (
        isinstance(args, tuple) and len(args) == 2 and args[1] in TICKS
    )  # beat's "Sending due task"


for _logger in ("celery.beat", "celery.worker.strategy", "celery.app.trace"):
    logging.getLogger(_logger).addFilter(QuietTicks())
