"""Webhooks cannot be pointed at the platform's own network: a webhook to 127.0.0.1, 10.0.0.0/8,
169.254.169.254, [::1], a name that resolves to loopback, or a receiver that redirects to one,
is refused at creation or recorded failed at send, and no request reaches it. A real receiver
on loopback counts hits: with the guard on it gets none; allow-listed, it gets them.
Nothing here connects anywhere but loopback: for other ranges the test fails if a connection
is even attempted."""

import re

import pytest
from django.contrib.auth.models import Group
from django.core.management import CommandError, call_command
from django.test import Client

from apps.tenants import roles
from apps.tenants.models import Tenant
from apps.webhooks import guard, sender, services
from apps.webhooks.models import Webhook, WebhookDelivery
from tests.webhooks.conftest import hook_row, later
from tests.webhooks.test_guard import fake_resolver


@pytest.mark.parametrize("url", [
    "http://127.0.0.1:{port}/hook", "http://10.0.0.1/hook", "http://10.200.3.4:8080/", "http://169.254.169.254/latest/meta-data/",
    "http://[::1]:{port}/hook", "http://localhost:{port}/hook", "http://[::ffff:127.0.0.1]:{port}/", "http://0.0.0.0:{port}/",
    "http://[fd00:ec2::254]/", "http://100.100.100.200/",
])  # fmt: skip
def test_create_webhook_refuses_non_public_targets_with_a_clear_message(
    cast, guard_on, receiver, connections, url
):
    counter = receiver()
    url = url.format(port=counter.port)
    with pytest.raises(
        CommandError, match="not a public address.*GPUPLATFORM_WEBHOOK_ALLOW_NETWORKS"
    ):
        call_command("create_webhook", "acme", url)
    assert not Webhook.objects.exists() and counter.hits == [] and connections == []


def test_create_webhook_takes_an_allow_listed_loopback_receiver(cast, settings, receiver, capsys):
    settings.WEBHOOK_ALLOW_NETWORKS = "127.0.0.0/8"
    call_command("create_webhook", "acme", receiver().url)
    assert Webhook.objects.count() == 1 and "secret:" in capsys.readouterr().out


def test_the_admin_refuses_a_private_url_next_to_the_field(cast, guard_on, browser_as):
    # As a platform admin (support staff may add one too: the test above).
    cast["staff"][0].groups.add(Group.objects.get(name=roles.PLATFORM_ADMIN))
    staff = browser_as("staff")
    acme = Tenant.objects.get(slug="acme")
    page = staff.post(
        "/admin/webhooks/webhook/add/",
        {"tenant": acme.pk, "url": "http://169.254.169.254/", "active": "on"},
    )
    assert page.status_code == 200 and "not a public address" in page.content.decode()
    assert not Webhook.objects.exists()


def test_support_staff_add_a_webhook_as_the_usage_page_says(cast, settings, browser_as):
    """Support staff (not platform admins) add a tenant's webhook in the admin, and the URL gets
    create_webhook's check word for word: nothing assumed, http(s) only, the guard."""
    settings.WEBHOOK_ALLOW_NETWORKS = "127.0.0.0/8"
    support = cast["staff"][0]
    assert list(support.groups.values_list("name", flat=True)) == [roles.SUPPORT]
    staff = browser_as("staff")
    acme = Tenant.objects.get(slug="acme")
    form = staff.get("/admin/webhooks/webhook/add/")
    # No secret on the form: it is made on save (the one a new row's default would show is not it).
    assert form.status_code == 200 and "field-secret" not in form.content.decode()
    for url, why in [("127.0.0.1:9/hook", "not an http(s) URL"), ("ftp://127.0.0.1/", "not an http(s) URL"),
                     ("http://169.254.169.254/", "not a public address")]:  # fmt: skip
        page = staff.post(
            "/admin/webhooks/webhook/add/", {"tenant": acme.pk, "url": url, "active": "on"}
        )
        assert page.status_code == 200 and why in page.content.decode(), url
        with pytest.raises(CommandError, match=re.escape(why)):
            call_command("create_webhook", "acme", url)
    assert not Webhook.objects.exists()
    added = staff.post(
        "/admin/webhooks/webhook/add/",
        {"tenant": acme.pk, "url": "http://127.0.0.1:9/hook", "active": "on"},
    )
    assert added.status_code == 302
    hook = Webhook.objects.get()
    assert (hook.tenant, hook.url, hook.active) == (acme, "http://127.0.0.1:9/hook", True)
    assert len(hook.secret) == 64
    assert hook.secret in staff.get(f"/admin/webhooks/webhook/{hook.pk}/change/").content.decode()
    paused = staff.post(
        "/admin/webhooks/webhook/add/", {"tenant": acme.pk, "url": "http://127.0.0.1:9/later"}
    )
    assert paused.status_code == 302 and Webhook.objects.get(url__endswith="/later").active is False
    # Adding is support's; changing or deleting one stays the platform admins'.
    support = type(support).objects.get(pk=support.pk)  # permissions uncached
    assert support.has_perm("webhooks.add_webhook")
    assert not support.has_perm("webhooks.change_webhook") and not support.has_perm(
        "webhooks.delete_webhook"
    )


@pytest.mark.parametrize("url", ["http://10.0.0.1/hook", "http://169.254.169.254/latest/meta-data/",
                                 "http://[fd00:ec2::254]/", "http://192.168.0.1:6379/"])  # fmt: skip
def test_a_send_to_a_private_or_metadata_address_fails_before_any_connection(cast, guard_on, connections,
                                                                             state_change, url):  # fmt: skip
    hook = hook_row(url)
    state_change()
    assert services.pump(now=later()) == 0
    deliveries = WebhookDelivery.objects.filter(webhook=hook).order_by("event_id")
    assert deliveries.count() == 2
    head = deliveries.first()
    assert head.attempts == 1 and head.state == "pending" and head.last_status_code is None
    assert head.last_error.startswith("refused: address")
    assert connections == []


def test_a_loopback_receiver_gets_nothing_with_the_guard_on_and_everything_allow_listed(
    cast, settings, guard_on, receiver, connections, state_change
):
    counter = receiver()
    hooks = [hook_row(counter.url), hook_row(f"http://localhost:{counter.port}/by-name"),
             hook_row(f"http://[::ffff:127.0.0.1]:{counter.port}/mapped")]  # fmt: skip
    state_change()
    assert services.pump(now=later()) == 0
    assert counter.hits == [] and connections == []
    assert set(WebhookDelivery.objects.filter(attempts=1).values_list("webhook_id", flat=True)) == {
        h.pk for h in hooks
    }

    settings.WEBHOOK_ALLOW_NETWORKS = "127.0.0.0/8"
    assert services.pump(now=later(60)) == 6
    assert (
        sorted(hit["path"] for hit in counter.hits)
        == ["/by-name"] * 2 + ["/hook"] * 2 + ["/mapped"] * 2
    )
    assert all(d.state == "delivered" for d in WebhookDelivery.objects.all())


def test_ipv6_loopback_gets_nothing(cast, guard_on, connections, state_change):
    hook_row("http://[::1]:9/hook")
    state_change()
    assert services.pump(now=later()) == 0
    assert (
        connections == []
        and WebhookDelivery.objects.filter(last_error__startswith="refused").count() == 1
    )


def test_a_name_is_resolved_at_send_time_and_the_connection_pinned_to_the_checked_address(
    cast, settings, guard_on, receiver, connections, monkeypatch, state_change
):
    counter = receiver()
    names = {"hooks.example": ["93.184.216.34"]}
    monkeypatch.setattr(guard.socket, "getaddrinfo", fake_resolver(names))
    hook = services.webhook_create(
        tenant=Tenant.objects.get(slug="acme"), url=f"http://hooks.example:{counter.port}/h"
    )
    names["hooks.example"] = ["127.0.0.1"]  # DNS rebinding: public when made, loopback when sent
    state_change()
    assert services.pump(now=later()) == 0
    assert counter.hits == [] and connections == []
    assert (
        WebhookDelivery.objects.filter(webhook=hook, last_error__startswith="refused").count() == 1
    )

    # Allow-listed, the one connection goes to the address checked, the name travels in Host.
    settings.WEBHOOK_ALLOW_NETWORKS = "127.0.0.0/8"
    assert services.pump(now=later(60)) == 2
    assert connections == ["127.0.0.1", "127.0.0.1"]
    assert {hit["headers"]["Host"] for hit in counter.hits} == {f"hooks.example:{counter.port}"}


def test_a_redirect_is_a_failed_delivery_and_never_followed(
    cast, settings, receiver, connections, state_change
):
    settings.WEBHOOK_ALLOW_NETWORKS = (
        "127.0.0.0/8"  # even the target allowed: redirects are never followed
    )
    target = receiver()
    for status in (301, 302, 307, 308):
        WebhookDelivery.objects.all().delete()
        Webhook.objects.all().delete()
        redirector = receiver(status=status, location=target.url)
        hook = hook_row(redirector.url)
        state_change()
        assert services.pump(now=later()) == 0
        head = WebhookDelivery.objects.filter(webhook=hook).order_by("event_id").first()
        assert (head.state, head.attempts, head.last_status_code) == ("pending", 1, status)
        assert head.last_error == f"redirect ({status}) not followed"
        assert len(redirector.hits) == 1 and redirector.hits[0]["method"] == "POST"
    assert target.hits == []


def test_the_tenant_sees_the_status_code_only(cast, settings, receiver, state_change):
    settings.WEBHOOK_ALLOW_NETWORKS = "127.0.0.0/8"
    hook_row(receiver(status=302, location="http://169.254.169.254/").url)
    private = hook_row("http://10.0.0.1/")
    state_change()
    services.pump(now=later())
    errors = set(
        WebhookDelivery.objects.exclude(last_error="").values_list("last_error", flat=True)
    )
    assert {e.split(":")[0] for e in errors} == {"redirect (302) not followed", "refused"}
    bob = Client()
    bob.force_login(cast["bob"][0])
    page = bob.get("/usage/").content.decode()
    assert "302" in page and private.url in page
    assert (
        not any(error in page for error in errors)
        and "not followed" not in page
        and "refused" not in page
    )


def test_a_trickling_receiver_is_cut_at_the_deadline(settings, receiver):
    settings.WEBHOOK_ALLOW_NETWORKS = "127.0.0.0/8"
    slow = receiver(hold=True)
    outcome = sender.post(slow.url, b"{}", {"Content-Type": "application/json"}, total=0.5)
    assert (
        outcome.status is None and outcome.error == "no answer within 0.5 s" and len(slow.hits) == 1
    )


def test_the_answer_body_is_not_kept(settings):
    import http.server
    import threading

    class Big(http.server.BaseHTTPRequestHandler):
        def do_POST(self):
            self.rfile.read(int(self.headers["Content-Length"]))
            self.send_response(200)
            self.send_header("Content-Length", str(50 * 1024 * 1024))
            self.end_headers()
            try:
                for _ in range(50 * 1024):
                    self.wfile.write(b"x" * 1024)
            except OSError:
                pass  # the sender stopped reading, as it should

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Big)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    settings.WEBHOOK_ALLOW_NETWORKS = "127.0.0.0/8"
    try:
        outcome = sender.post(f"http://127.0.0.1:{server.server_address[1]}/", b"{}", {})
    finally:
        server.shutdown()
        server.server_close()
    assert outcome == sender.Outcome(200, "")


def test_https_goes_through_tls_to_the_checked_address(settings, receiver, connections):
    settings.WEBHOOK_ALLOW_NETWORKS = "127.0.0.0/8"
    plain = receiver()  # speaks HTTP only: the TLS handshake the sender starts must fail
    outcome = sender.post(plain.url.replace("http://", "https://"), b"{}", {})
    assert outcome == sender.Outcome(None, "TLS handshake or certificate check failed")
    assert connections == ["127.0.0.1"] and plain.hits == []


def test_a_receiver_trickling_its_headers_is_cut_by_the_watchdog(settings):
    """Each byte comes within the socket timeout, so only the one deadline stops it."""
    import socket
    import threading

    listener = socket.create_server(("127.0.0.1", 0))
    stop = threading.Event()

    def trickle():
        conn, _ = listener.accept()
        with conn:
            conn.recv(65536)
            conn.sendall(b"HTTP/1.1 200 OK\r\n")
            while not stop.wait(0.05):
                try:
                    conn.sendall(b"X-Slow: 1\r\n")
                except OSError:
                    return

    threading.Thread(target=trickle, daemon=True).start()
    settings.WEBHOOK_ALLOW_NETWORKS = "127.0.0.0/8"
    try:
        outcome = sender.post(f"http://127.0.0.1:{listener.getsockname()[1]}/", b"{}", {}, total=1)
    finally:
        stop.set()
        listener.close()
    assert outcome == sender.Outcome(None, "no answer within 1 s")
