"""What Flower sees of the platform's messages (on the session's real Redis): Celery's default,
no task-sent event. The agents send no task events (their broker user may not publish on any
channel, apps/nodes/broker.py), so a sent event for each start or stop message showed every
agent message in Flower as sent and never received; the dispatcher's and webhooks' own tasks
show from the moment their worker receives them."""

import uuid

import redis
from celery import current_app
from django.conf import settings

from apps.platform.names import Task, node_queue
from apps.scheduling import publish


def test_a_message_to_an_agent_publishes_no_task_sent_event():
    broker = redis.Redis.from_url(settings.CELERY_BROKER_URL)
    node = f"ev-{uuid.uuid4().hex[:8]}"
    events = broker.pubsub(ignore_subscribe_messages=True)
    events.psubscribe("*celeryev*")
    events.get_message(timeout=5)  # the subscription's confirmation
    try:
        publish._send(
            Task.STOP_ATTEMPT, node_queue(node), attempt_id=1, rank=0, token="t", why="cancel"
        )
        # Then an event the app does publish on the same channels: once it is here, anything the
        # send above published is here too (one connection, in order).
        with current_app.events.default_dispatcher() as dispatcher:
            dispatcher.send("worker-online")
        channels = []
        while not channels or not channels[-1].endswith(b"celeryev/worker.online"):
            message = events.get_message(timeout=5)
            assert message is not None, f"the marker event never came; seen: {channels}"
            channels.append(message["channel"])
        assert not [c for c in channels if c.endswith(b"celeryev/task.sent")], channels
    finally:
        events.close()
        for key in broker.scan_iter(f"*{node}*"):
            broker.delete(key)
