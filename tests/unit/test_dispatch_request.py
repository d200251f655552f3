"""At most one dispatch request waits at a time (apps/scheduling/tasks.py request_dispatch):
later requests are answered by the waiting one's pass, which deletes the mark before it reads
the queue; a request that could not be sent does not hold back the next."""

import pytest
import redis

from apps.scheduling import tasks
from apps.scheduling.redis import shared_client


@pytest.fixture
def sent(monkeypatch):
    shared_client().delete(tasks.REQUESTED_KEY)
    messages = []
    monkeypatch.setattr(tasks.dispatch, "apply_async", lambda **options: messages.append(options))
    monkeypatch.setattr(tasks.dispatcher, "dispatch_once", lambda: None)
    yield messages
    shared_client().delete(tasks.REQUESTED_KEY)


def test_requests_while_one_waits_send_nothing_more(sent):
    for _ in range(5):
        tasks.request_dispatch()
    assert len(sent) == 1
    assert 0 < shared_client().ttl(tasks.REQUESTED_KEY) <= tasks.REQUESTED_TTL_S


def test_the_pass_takes_the_mark_so_a_later_request_is_sent(sent):
    tasks.request_dispatch()
    tasks.dispatch()  # the waiting request's task: deletes the mark, then runs its pass
    assert not shared_client().exists(tasks.REQUESTED_KEY)
    tasks.request_dispatch()
    assert len(sent) == 2


def test_a_request_that_could_not_be_sent_leaves_no_mark(sent, monkeypatch):
    def broker_down(**options):
        raise ConnectionError("broker down")

    monkeypatch.setattr(tasks.dispatch, "apply_async", broker_down)
    tasks.request_dispatch()  # logs, does not raise
    assert not shared_client().exists(tasks.REQUESTED_KEY)


def test_without_redis_the_request_is_sent_anyway(sent, monkeypatch):
    class Down:
        def set(self, *args, **kwargs):
            raise redis.ConnectionError("down")

    monkeypatch.setattr(tasks, "shared_client", lambda: Down())
    tasks.request_dispatch()
    tasks.request_dispatch()
    assert len(sent) == 2
