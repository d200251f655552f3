"""Run by test_redis_tls.py in a process of its own with REDIS_URL=rediss://...: every client the
platform has talks to Redis over TLS. Prints one JSON object of what worked."""

import json
import os

import django

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "gpuplatform.settings")
django.setup()

import redis  # noqa: E402
from django.conf import settings  # noqa: E402

from apps.admission import buckets  # noqa: E402
from apps.nodes import broker  # noqa: E402
from apps.scheduling.redis import client  # noqa: E402
from gpuplatform import health  # noqa: E402
from gpuplatform.celery import app  # noqa: E402

if os.environ.get("ONLY") == "celery":  # the broker alone (kombu's own TLS set-up)
    app.send_task("workers.start_attempt", kwargs={}, queue="node.tls-1", retry=False)
    raise SystemExit(0)
result = {
    "scheduling": client().ping(),
    "buckets": buckets.client().ping(),
    "health": health._redis_ok(),
}
conn = client().connection_pool.get_connection("PING")
result["tls"] = type(conn).__name__
client().connection_pool.release(conn)
app.send_task("workers.start_attempt", kwargs={"over": "tls"}, queue="node.tls-1", retry=False)
with app.connection_for_read() as kombu_conn:
    result["celery_transport_ssl"] = bool(kombu_conn.ssl)
    message = kombu_conn.SimpleQueue("node.tls-1").get(timeout=5)
    result["celery_roundtrip"] = message.headers["task"]
    message.ack()
url = broker.node_broker_url("tls-1")
result["agent_url_scheme"] = url.split(":", 1)[0]
result["agent_ping"] = redis.Redis.from_url(url).ping()
result["broker_use_ssl"] = str(settings.CELERY_BROKER_USE_SSL)
print(json.dumps(result))
