"""A slow receiver delays no one else: sends run per webhook on their own threads (the Celery
`webhooks` worker, or `deliver_webhooks`' pool), and each receiver (scheme://host:port) has at
most WEBHOOK_RECEIVER_CONCURRENCY sends in flight. No timing: the slow receiver holds its
request until the test lets go, and the fast one must be served while it is still held."""

import time

import pytest

from apps.platform.names import Queue, Task
from apps.scheduling.schedule import beat_schedule
from apps.webhooks import sender, services, slots, tasks
from apps.webhooks.models import DeliveryState, WebhookDelivery
from apps.webhooks.runner import LocalPump
from tests.webhooks.conftest import hook_row, later


@pytest.fixture(autouse=True)
def allow_loopback(settings, monkeypatch):
    settings.WEBHOOK_ALLOW_NETWORKS = "127.0.0.0/8"
    monkeypatch.setattr(
        sender, "TOTAL_SECONDS", 60
    )  # the slow receiver is held by the test, not a clock


@pytest.fixture
def pool():
    pools = []

    def make(workers: int) -> LocalPump:
        pools.append(LocalPump(workers=workers))
        return pools[-1]

    yield make
    for p in pools:
        p.shutdown()


def test_a_slow_receiver_does_not_hold_back_a_fast_one(
    transactional_db, cast, receiver, state_change, pool
):
    slow, fast = receiver(hold=True), receiver()
    slow_hook, fast_hook = hook_row(slow.url), hook_row(fast.url)
    state_change()
    local = pool(2)
    local.tick(now=later())
    assert slow.entered.wait(30)  # the slow receiver has the first delivery and holds it
    assert fast.wait_hits(2), "the fast receiver's deliveries waited on the slow one"
    assert (
        local.in_flight[fast_hook.pk].result(30) == 2
    )  # recorded delivered, the slow one still held
    assert len(slow.hits) == 1 and not slow.release.is_set()
    assert set(
        WebhookDelivery.objects.filter(webhook=fast_hook).values_list("state", flat=True)
    ) == {"delivered"}

    slow.release.set()
    assert local.in_flight[slow_hook.pk].result(30) == 2
    assert WebhookDelivery.objects.exclude(state=DeliveryState.DELIVERED).count() == 0


def test_one_receiver_gets_at_most_its_concurrency(
    transactional_db, cast, settings, receiver, state_change, pool
):
    settings.WEBHOOK_RECEIVER_CONCURRENCY = 1
    slow, fast = receiver(hold=True), receiver()
    first, second = hook_row(slow.url), hook_row(slow.url.replace("/hook", "/other"))
    hook_row(fast.url)
    state_change()
    local = pool(3)
    local.tick(now=later())
    assert slow.entered.wait(30) and fast.wait_hits(2)
    held = first if slow.hits[0]["path"] == "/hook" else second
    waiting = second if held is first else first
    assert (
        local.in_flight[waiting.pk].result(30) == 0
    )  # no slot free: it stops, its deliveries stay due
    assert len(slow.hits) == 1
    assert WebhookDelivery.objects.filter(webhook=waiting, attempts=0).count() == 2

    slow.release.set()
    assert local.in_flight[held.pk].result(30) == 2
    local.tick(now=later(1))
    assert local.in_flight[waiting.pk].result(30) == 2
    assert len(slow.hits) == 4


def test_receiver_slots_count_holders_and_forget_dead_ones():
    origin = f"http://127.0.0.1:1/{time.time_ns()}"
    a = slots.acquire(origin, limit=2)
    b = slots.acquire(origin, limit=2)
    assert a and b and slots.acquire(origin, limit=2) is None
    slots.release(origin, a)
    c = slots.acquire(origin, limit=2)
    assert c and slots.acquire(origin, limit=2) is None
    # A holder whose lease ended (its worker died mid-send) stops counting.
    slots.shared_client().zadd(slots.key_for(origin), {b: time.time() - 1})
    assert slots.acquire(origin, limit=2)


def test_the_pump_hands_each_due_webhook_to_the_webhooks_queue(
    cast, receiver, state_change, monkeypatch
):
    hooks = [hook_row(receiver().url), hook_row(receiver().url)]
    state_change()
    sent = []
    monkeypatch.setattr(
        tasks.deliver_task, "apply_async", lambda args, **options: sent.append((args, options))
    )
    settled = later()
    monkeypatch.setattr(tasks.timezone, "now", lambda: settled)
    tasks.pump_task()
    assert sorted(args for args, _ in sent) == sorted((h.pk,) for h in hooks)
    assert {options["queue"] for _, options in sent} == {Queue.WEBHOOKS}
    assert beat_schedule()["webhooks"]["options"]["queue"] == Queue.WEBHOOKS
    assert (tasks.PUMP_TASK, tasks.DELIVER_TASK) == (Task.WEBHOOKS_PUMP, "webhooks.deliver")


def test_the_deliver_task_sends_that_webhooks_due_deliveries(
    cast, receiver, state_change, monkeypatch
):
    counter = receiver()
    hook, other = hook_row(counter.url), hook_row(counter.url.replace("/hook", "/other"))
    state_change()
    settled = later()
    services.deliveries_enqueue(now=settled)
    monkeypatch.setattr(services.timezone, "now", lambda: settled)
    tasks.deliver_task(hook.pk)
    assert [hit["path"] for hit in counter.hits] == ["/hook", "/hook"]
    assert WebhookDelivery.objects.filter(webhook=other, attempts=0).count() == 2
