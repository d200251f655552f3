"""Turning job state changes into webhook deliveries, and sending them.

An outbox: `deliveries_enqueue` reads the audit log (JobEvent) past each webhook's cursor and
records one delivery per state change; `deliveries_send` posts them in order, signed, and
schedules a retry with exponential backoff on any failure. Nothing in the job's own
transaction depends on a receiver being up. `pump` does both in this process (tests, `manage.py
deliver_webhooks --once`); in production the `webhooks.pump` beat task enqueues and hands each
webhook with due deliveries to a `webhooks.deliver` task on the `webhooks` queue, whose own worker
sends them (`webhook_deliver`), each send holding one of its receiver's slots (apps/webhooks/slots.py)
so a slow receiver ties up a bounded number of threads and delays no one else.

Where a webhook may point is apps/webhooks/guard.py (checked at creation and again at each send);
how it is sent is apps/webhooks/sender.py (pinned to the checked address, no redirects, one
deadline, the status code only).

Signature: `X-Gpuplatform-Signature: sha256=<hex>`, the HMAC-SHA256 with the webhook's secret of
`<X-Gpuplatform-Timestamp>.<body>`; receivers recompute it and refuse old timestamps.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import time
from datetime import datetime, timedelta

from django.core.exceptions import ValidationError
from django.core.validators import URLValidator
from django.db import transaction
from django.db.models import F
from django.utils import timezone

from apps.jobs.arrays import ENDED_KIND as ARRAY_ENDED  # a job array's end
from apps.jobs.models import JobEvent
from apps.platform.names import GPU_IDLE_KIND  # a job's GPUs sat idle (apps/telemetry/idle.py)
from apps.webhooks import sender
from apps.webhooks.guard import WebhookRefused, checked_address, target_of
from apps.webhooks.models import DeliveryState, Webhook, WebhookDelivery
from apps.webhooks.slots import receiver_slot

log = logging.getLogger(__name__)

SETTLE_SECONDS = 2  # read only events this old: on PostgreSQL ids may commit out of order
MAX_ATTEMPTS = 12
MAX_BACKOFF_SECONDS = 600
SEND_TIMEOUT_SECONDS = sender.TOTAL_SECONDS  # the whole exchange, connect to last byte
CLAIM_SECONDS = 30  # a claimed delivery is not sent again by another pump within this
BATCH = 200
MAX_URL = Webhook._meta.get_field("url").max_length or 500


def backoff(attempts: int) -> timedelta:
    """1 s, 2 s, 4 s, ... capped at 10 minutes."""
    return timedelta(seconds=min(MAX_BACKOFF_SECONDS, 2 ** max(0, attempts - 1)))


def sign(secret: str, timestamp: str, body: bytes) -> str:
    digest = hmac.new(secret.encode(), timestamp.encode() + b"." + body, hashlib.sha256).hexdigest()
    return f"sha256={digest}"


def check_url(url: str) -> None:
    """Where a new webhook may point, or WebhookRefused in our words: an http(s) URL of at most
    MAX_URL characters (Django's URL syntax: `create_webhook`'s and the admin's one rule) whose
    host resolves now only to addresses the guard allows."""
    if len(url) > MAX_URL:
        raise WebhookRefused(f"longer than {MAX_URL} characters")
    try:
        URLValidator(schemes=["http", "https"])(url)
    except ValidationError:
        raise WebhookRefused("not an http(s) URL") from None
    checked_address(url)


def webhook_create(*, tenant, url: str) -> Webhook:
    """A new webhook hears about state changes from now on, not the tenant's history. Refused
    (WebhookRefused, our words) when the URL is not http(s) or its host resolves now to an address
    the guard refuses (`check_url`); each send checks again, since the name may resolve
    elsewhere later."""
    check_url(url)
    latest = JobEvent.objects.order_by("-pk").values_list("pk", flat=True).first() or 0
    return Webhook.objects.create(tenant=tenant, url=url, cursor=latest)


def payload_for(event: JobEvent) -> dict:
    job = event.job
    if event.kind == ARRAY_ENDED:  # once per array, on the task that ended last
        return {
            "type": "array.ended",
            "event_id": event.pk,
            "array": {"id": event.data.get("array"), "name": job.name, "tenant": job.tenant.slug,
                      "size": event.data.get("size")},
            "counts": event.data.get("counts", {}),
            "at": event.created_at.isoformat(),
        }  # fmt: skip
    if event.kind == GPU_IDLE_KIND:
        return {"type": GPU_IDLE_KIND, "event_id": event.pk, **event.data,
                "job": {"id": str(job.pk), "name": job.name, "tenant": job.tenant.slug},
                "reason": event.reason, "at": event.created_at.isoformat()}  # fmt: skip
    return {
        "type": "job.state_changed",
        "event_id": event.pk,
        "job": {"id": str(job.pk), "name": job.name, "tenant": job.tenant.slug},
        "from": event.from_state or None,
        "to": event.to_state,
        "reason": event.reason,
        "actor": event.actor,
        "at": event.created_at.isoformat(),
    }


def deliveries_enqueue(*, now: datetime | None = None) -> int:
    now = now or timezone.now()
    created = 0
    for webhook in Webhook.objects.filter(active=True):
        created += _enqueue_for(
            webhook, settled_before=now - timedelta(seconds=SETTLE_SECONDS), now=now
        )
    return created


@transaction.atomic
def _enqueue_for(webhook: Webhook, *, settled_before: datetime, now: datetime) -> int:
    events = list(
        JobEvent.objects.filter(job__tenant_id=webhook.tenant_id, kind__in=("state", ARRAY_ENDED, GPU_IDLE_KIND), pk__gt=webhook.cursor,
                                created_at__lte=settled_before)
        .select_related("job__tenant").order_by("pk")[:BATCH]
    )  # fmt: skip
    if not events:
        return 0
    # The guarded cursor move makes a second pump that read the same cursor give up here.
    if not Webhook.objects.filter(pk=webhook.pk, cursor=webhook.cursor).update(
        cursor=events[-1].pk
    ):
        return 0
    WebhookDelivery.objects.bulk_create(
        [
            WebhookDelivery(webhook=webhook, event=e, payload=payload_for(e), next_attempt_at=now)
            for e in events
        ],
        ignore_conflicts=True,
    )
    return len(events)


def deliveries_send(*, now: datetime | None = None) -> int:
    """Send due deliveries here, webhook after webhook (tests and the one-process pump)."""
    now = now or timezone.now()
    return sum(
        webhook_deliver(webhook_id=webhook_id, now=now) for webhook_id in webhooks_due(now=now)
    )


def webhooks_due(*, now: datetime) -> list[int]:
    waiting = WebhookDelivery.objects.filter(state=DeliveryState.PENDING, next_attempt_at__lte=now)
    # order_by: the model's default ordering would put created_at into the DISTINCT, one row per delivery
    return list(
        waiting.order_by("webhook_id").values_list("webhook_id", flat=True).distinct()[:BATCH]
    )


def webhook_deliver(*, webhook_id: int, now: datetime | None = None) -> int:
    """Send one webhook's due deliveries in event order: a delivery waiting on its backoff holds
    back the later ones of the same webhook, so a receiver sees a job's states in order. Each
    send holds a slot of its receiver; with none free it stops, and the deliveries stay due."""
    now = now or timezone.now()
    ok = 0
    for _ in range(BATCH):
        head = (
            WebhookDelivery.objects.filter(webhook_id=webhook_id, state=DeliveryState.PENDING)
            .select_related("webhook").order_by("event_id").first()
        )  # fmt: skip
        if head is None or head.next_attempt_at > now:
            break
        with receiver_slot(origin_of(head.webhook.url)) as have_slot:
            if not have_slot or not _claim(head, now) or not _attempt(head, now):
                break
        ok += 1
    return ok


def origin_of(url: str) -> str:
    try:
        return target_of(url).origin
    except WebhookRefused:
        return url  # refused again at send; its own slot keeps it from anyone else's


def _claim(delivery: WebhookDelivery, now: datetime) -> bool:
    claimed_until = now + timedelta(seconds=CLAIM_SECONDS)
    return bool(
        WebhookDelivery.objects.filter(pk=delivery.pk, state=DeliveryState.PENDING, attempts=delivery.attempts,
                                       next_attempt_at=delivery.next_attempt_at)
        .update(next_attempt_at=claimed_until)
    )  # fmt: skip


def _attempt(delivery: WebhookDelivery, now: datetime) -> bool:
    outcome = post(delivery)
    status, error = outcome.status, outcome.error
    attempts = delivery.attempts + 1
    if outcome.ok:
        WebhookDelivery.objects.filter(pk=delivery.pk).update(
            state=DeliveryState.DELIVERED, attempts=attempts, last_status_code=status, last_error="",
            delivered_at=timezone.now(),
        )  # fmt: skip
        return True
    gave_up = attempts >= MAX_ATTEMPTS
    WebhookDelivery.objects.filter(pk=delivery.pk).update(
        state=DeliveryState.FAILED if gave_up else DeliveryState.PENDING,
        attempts=F("attempts") + 1, last_status_code=status, last_error=error[:300],
        next_attempt_at=now + backoff(attempts),
    )  # fmt: skip
    log.info("webhook delivery %s failed (attempt %d): %s", delivery.pk, attempts, error or status)
    return False


def post(delivery: WebhookDelivery) -> sender.Outcome:
    body = json.dumps(delivery.payload, separators=(",", ":"), sort_keys=True).encode()
    timestamp = str(int(time.time()))
    return sender.post(delivery.webhook.url, body, {
        "Content-Type": "application/json",
        "User-Agent": "gpuplatform-webhooks/1",
        "X-Gpuplatform-Delivery": str(delivery.pk),
        "X-Gpuplatform-Event": delivery.payload.get("type", ""),
        "X-Gpuplatform-Timestamp": timestamp,
        "X-Gpuplatform-Signature": sign(delivery.webhook.secret, timestamp, body),
    })  # fmt: skip


def pump(*, now: datetime | None = None) -> int:
    deliveries_enqueue(now=now)
    return deliveries_send(now=now)
