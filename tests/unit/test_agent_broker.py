"""The agent's Celery app keeps no copy of a taken message in Redis (workers/celery_app.py
`NO_ACK_EMULATION`): what repairs a start taken by an agent that dies is the database
(docs/reliability.md; the whole case with a SIGKILLed agent: tests/e2e/test_agent_ack.py, which
needs a fencing agent). Run against the test run's Redis, in a process of its own: `configure`
sets up the agent's one app, as `main()` does."""

import json
import os
import pathlib
import subprocess
import sys
import uuid

import redis

ROOT = pathlib.Path(__file__).resolve().parents[2]

TAKE_ONE = """
import json, sys
import redis
from kombu import Consumer, Producer
from apps.platform import broker_keys
from workers import agent, celery_app

agent.forbid_django()
url, node = sys.argv[1], sys.argv[2]
app = celery_app.configure(broker_url=url, node=node, visibility_timeout=5)
queue = app.conf.task_queues[0]
keys = broker_keys.unacked_options(node)
broker = redis.Redis.from_url(url)
seen = []


def on_message(body, message):
    seen.append({"queue": broker.llen(queue.name), "unacked": broker.hlen(keys["unacked_key"]),
                 "index": broker.zcard(keys["unacked_index_key"])})
    if sys.argv[3] == "ack":
        message.ack()


with app.connection_for_read() as conn:
    Producer(conn).publish({"start": 1}, exchange="", routing_key=queue.name)
    with Consumer(conn, queues=[queue], callbacks=[on_message], accept=["json"]):
        conn.drain_events(timeout=10)
seen.append({"queue after close": broker.llen(queue.name)})
print(json.dumps(seen))
"""


def take_one(ack: str) -> list[dict]:
    url, node = os.environ["REDIS_URL"], f"ack-{uuid.uuid4().hex[:8]}"
    try:
        result = subprocess.run([sys.executable, "-c", TAKE_ONE, url, node, ack], capture_output=True, text=True,
                                cwd=ROOT, timeout=60)  # fmt: skip
        assert result.returncode == 0, result.stderr
        return json.loads(result.stdout.strip().splitlines()[-1])
    finally:
        from apps.platform import broker_keys

        redis.Redis.from_url(url).delete(*broker_keys.node_keys(node))


def test_a_message_the_agent_has_taken_is_nowhere_in_redis_until_its_ack():
    # Taken from the queue, and neither in the node's unacked hash nor its index meanwhile.
    assert take_one("ack") == [{"queue": 0, "unacked": 0, "index": 0}, {"queue after close": 0}]


def test_a_message_taken_and_not_acked_goes_back_to_the_queue_when_the_agent_closes_its_connection():
    # A warm shutdown (or a consumer restart) pushes back what the agent took and did not run.
    assert take_one("no ack") == [{"queue": 0, "unacked": 0, "index": 0}, {"queue after close": 1}]


ONE_BACKEND = """
import threading
from workers import agent, celery_app

agent.forbid_django()
app = celery_app.configure(broker_url="redis://127.0.0.1:1/0", node="n-backend", visibility_timeout=60)
first = app.backend  # the worker's start (WorkController) asks for it first, in the main thread
seen = []
threads = [threading.Thread(target=lambda: seen.append(app.backend)) for _ in range(3)]
for thread in threads:
    thread.start()
for thread in threads:
    thread.join()
print(len({id(backend) for backend in [first, *seen]}), type(app.backend).__name__)
"""


def test_the_agent_builds_its_disabled_result_backend_once_for_all_its_threads():
    # Each build scans every installed package's entry points: once, not once a pool thread.
    result = subprocess.run([sys.executable, "-c", ONE_BACKEND], capture_output=True, text=True, cwd=ROOT,
                            timeout=60)  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["1", "DisabledBackend"]
