"""A node agent's Celery app as the agent configures it (no Django): the settings and worker
options of apps/platform/broker_keys.py, the broker URL from the environment. Its one task
appends its arguments to DONE_FILE, after sleeping `sleep` seconds."""

import json
import os
import time

from celery import Celery

from apps.platform import broker_keys

NODE = os.environ["NODE"]
app = Celery("test-agent", set_as_current=False)
app.conf.update(
    broker_url=os.environ["AGENT_BROKER_URL"], task_acks_late=True, task_reject_on_worker_lost=True,
    worker_prefetch_multiplier=4, task_ignore_result=True, broker_connection_retry_on_startup=True,
    broker_connection_max_retries=3,
    **broker_keys.agent_celery_settings(NODE, visibility_timeout=int(os.environ.get("VISIBILITY", "3600"))),
)  # fmt: skip


@app.task(name="workers.start_attempt")
def start_attempt(**kwargs):
    if os.environ.get("STARTED_FILE"):
        with open(os.environ["STARTED_FILE"], "a") as file:
            file.write(json.dumps(kwargs) + "\n")
    time.sleep(kwargs.get("sleep", 0))
    with open(os.environ["DONE_FILE"], "a") as file:
        file.write(json.dumps(kwargs) + "\n")
