"""List pages cost a bounded number of queries, however many rows they show."""

from datetime import timedelta

import pytest
from django.db import connection
from django.test import Client
from django.utils import timezone

from apps.tenants.models import Tenant
from apps.webhooks import services
from apps.webhooks.models import WebhookDelivery


@pytest.fixture(autouse=True)
def allow_loopback(settings):
    settings.WEBHOOK_ALLOW_NETWORKS = "127.0.0.0/8"  # the webhooks below point at 127.0.0.1


FORM = {"template": "demo-train", "param_steps": "2", "gpus": "1", "nodes": "1", "gpu_sku": ""}


def queries_for(client, path) -> int:
    # request_started resets connection.queries, so count with a hook on every executed query.
    count = 0

    def counter(execute, sql, params, many, context):
        nonlocal count
        count += 1
        return execute(sql, params, many, context)

    with connection.execute_wrapper(counter):
        assert client.get(path).status_code == 200
    return count


@pytest.mark.parametrize("path", ["/", "/jobs/", "/usage/"])
def test_customer_list_pages_do_not_grow_with_the_rows(browser_as, path):
    bob = browser_as("bob")
    hook = services.webhook_create(
        tenant=Tenant.objects.get(slug="acme"), url="http://127.0.0.1:9/"
    )
    for _ in range(3):
        bob.post("/jobs/new/", FORM)
    services.deliveries_enqueue(now=timezone.now() + timedelta(seconds=10))
    few = queries_for(bob, path)
    for _ in range(20):
        bob.post("/jobs/new/", FORM)
    services.deliveries_enqueue(now=timezone.now() + timedelta(seconds=10))
    assert WebhookDelivery.objects.filter(webhook=hook).count() == 23
    assert queries_for(bob, path) <= few <= 20


def test_the_delivery_log_admin_does_not_grow_with_the_rows(browser_as):
    hook = services.webhook_create(
        tenant=Tenant.objects.get(slug="acme"), url="http://127.0.0.1:9/"
    )
    bob, staff = browser_as("bob"), browser_as("staff")
    bob.post("/jobs/new/", FORM)
    services.deliveries_enqueue(now=timezone.now() + timedelta(seconds=10))
    few = queries_for(staff, "/admin/webhooks/webhookdelivery/")
    for _ in range(15):
        bob.post("/jobs/new/", FORM)
    services.deliveries_enqueue(now=timezone.now() + timedelta(seconds=10))
    assert WebhookDelivery.objects.filter(webhook=hook).count() == 16
    assert queries_for(staff, "/admin/webhooks/webhookdelivery/") <= few <= 20
    assert Client().get("/admin/webhooks/webhookdelivery/").status_code == 302
