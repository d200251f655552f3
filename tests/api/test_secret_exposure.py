"""No endpoint, page, admin view or log line shows a secret's value (issue 17). One distinctive
value is created through the API and then looked for everywhere it could leak: the secrets API,
the jobs API for a job that names the secret (detail, list, logs), the OpenAPI document, the
agent's own assignment, the admin (changelist, change, history; the audit log's rows), the web pages,
and every log record at DEBUG, formatted both ways. Only the agent API's secrets endpoint, for
the member's own node, answers it."""

import logging
import sys

import pytest
from django.contrib.admin.models import LogEntry
from django.test import Client
from django.views.debug import ExceptionReporter

from apps.jobs.models import Job
from apps.nodes.credentials import issue_credential
from apps.secrets import crypto
from apps.secrets.models import Secret
from apps.secrets.services import secret_create
from apps.tenants.models import Tenant
from apps.tenants.services import user_create
from gpuplatform.logs import JsonLinesFormatter
from tests.factories import client_for, make_cast, make_node
from tests.unit.test_agent_api import bearer, fenced, member_url
from tests.unit.test_dispatcher import placed_and_started

VALUE = "zq-DISTINCTIVE-secret-value-8c41e7"  # noqa: S105 (a test's value)
PLAIN = logging.Formatter("%(asctime)s %(levelname)s %(name)s %(message)s")


@pytest.fixture
def world(db, caplog):
    caplog.set_level(logging.DEBUG)
    for name in ("django.db.backends", "django.request", "django.server", "axes"):
        caplog.set_level(logging.DEBUG, logger=name)
    cast = make_cast()
    make_node("h1", gpus=1)
    alice = client_for(cast["alice"][1])
    assert (
        alice.post(
            "/api/v1/secrets/", {"name": "HF_TOKEN", "value": VALUE}, format="json"
        ).status_code
        == 201
    )
    job, attempt = placed_and_started(cast)
    Job.objects.filter(pk=job.pk).update(secrets=["HF_TOKEN"])
    root, _ = user_create(username="root", tenant_slug=None, superuser=True)
    admin = Client()
    admin.force_login(root)
    return cast, job, attempt, alice, admin


def seen(response) -> str:
    assert response.status_code < 500, response.status_code
    return (
        b"".join(response).decode(errors="replace")
        if response.streaming
        else response.content.decode()
    )


def test_the_value_appears_nowhere_but_in_the_agents_secrets_endpoint(world, caplog):
    cast, job, attempt, alice, admin = world
    row = Secret.objects.get()
    assert VALUE not in row.ciphertext
    pages = []
    api = {name: client_for(cast[name][1]) for name in ("alice", "bob", "carol", "dave")}
    for client in api.values():
        pages += [client.get("/api/v1/secrets/"), client.get("/api/v1/secrets/HF_TOKEN/"),
                  client.get(f"/api/v1/jobs/{job.pk}/"), client.get("/api/v1/jobs/"),
                  client.get(f"/api/v1/jobs/{job.pk}/logs/"), client.get("/api/v1/usage/")]  # fmt: skip
    pages.append(alice.put("/api/v1/secrets/HF_TOKEN/", {"value": VALUE}, format="json"))
    pages.append(
        alice.post("/api/v1/secrets/", {"name": "HF_TOKEN", "value": VALUE}, format="json")
    )  # 400
    pages.append(
        alice.post("/api/v1/secrets/", {"name": "bad name", "value": VALUE}, format="json")
    )  # 400
    pages.append(
        api["bob"].post("/api/v1/secrets/", {"name": "X", "value": VALUE}, format="json")
    )  # 403
    pages.append(Client().get("/api/schema/", {"format": "json"}))
    pages.append(client_for(cast["staff"][1]).get("/api/v1/nodes/"))
    # the agent's own view of the member: names, never values
    node = bearer(issue_credential(node_name="h1")[1])
    pages += [
        node.get(member_url(attempt), **fenced(attempt)),
        node.get("/internal/agent/v1/assignments/"),
    ]
    # the admin, as a superuser
    pages += [admin.get("/admin/secrets/secret/"), admin.get(f"/admin/secrets/secret/{row.pk}/change/"),
              admin.get(f"/admin/secrets/secret/{row.pk}/history/"), admin.get("/admin/secrets/secret/add/"),
              admin.get(f"/admin/jobs/job/{job.pk}/change/"),
              admin.get("/admin/jobs/job/")]  # fmt: skip
    assert [r.status_code for r in pages[-6:]] == [200] * 6  # the admin pages, shown
    # the web pages, signed in
    web = Client()
    web.force_login(cast["alice"][0])
    pages += [
        web.get("/"),
        web.get("/secrets/"),
        web.get(f"/jobs/{job.pk}/"),
        web.get("/jobs/"),
        web.get("/usage/"),
    ]
    assert [r.status_code for r in pages[-5:]] == [200] * 5
    for response in pages:
        text = seen(response)
        assert VALUE not in text, (
            response.wsgi_request.path if hasattr(response, "wsgi_request") else response
        )
        assert row.ciphertext not in text
    assert all(VALUE not in entry.change_message for entry in LogEntry.objects.all())
    assert caplog.records  # the requests above did log (axes, django.request's 4xx warnings)
    for record in caplog.records:
        assert VALUE not in PLAIN.format(record) and VALUE not in JsonLinesFormatter().format(
            record
        )
        assert VALUE not in repr(record.__dict__)
    # and the one place it is answered: the member's own node, with its token
    answer = node.get(member_url(attempt, "secrets/"), **fenced(attempt))
    assert answer.json() == {"secrets": {"HF_TOKEN": VALUE}}


def test_the_admin_change_form_replaces_the_value_without_showing_it(world):
    _, _, _, _, admin = world
    row = Secret.objects.get()
    page = admin.get(f"/admin/secrets/secret/{row.pk}/change/").content.decode()
    assert 'name="new_value"' in page and 'type="password"' in page
    assert "ciphertext" not in page and VALUE not in page
    response = admin.post(f"/admin/secrets/secret/{row.pk}/change/",
                          {"new_value": "replaced-in-admin", "audit_reason": "rotating a leaked token"})  # fmt: skip
    assert response.status_code == 302, response.content.decode()[:2000]
    row.refresh_from_db()
    assert (
        crypto.decrypt(tenant_id=row.tenant_id, name="HF_TOKEN", ciphertext=row.ciphertext)
        == "replaced-in-admin"
    )
    entry = LogEntry.objects.filter(object_id=str(row.pk)).latest("pk")
    assert (
        "Replaced the value" in entry.change_message
        and "replaced-in-admin" not in entry.change_message
    )
    kept = admin.post(
        f"/admin/secrets/secret/{row.pk}/change/", {"new_value": "", "audit_reason": "look"}
    )
    assert kept.status_code == 302
    row.refresh_from_db()
    assert (
        crypto.decrypt(tenant_id=row.tenant_id, name="HF_TOKEN", ciphertext=row.ciphertext)
        == "replaced-in-admin"
    )


def test_an_admin_adds_a_secret_for_a_tenant(world):
    _, _, _, _, admin = world
    globex = Tenant.objects.get(slug="globex")
    response = admin.post("/admin/secrets/secret/add/", {"tenant": globex.pk, "name": "WANDB_KEY",
                                                          "new_value": "w-value", "audit_reason": "asked by globex"})  # fmt: skip
    assert response.status_code == 302, response.content.decode()[:2000]
    row = Secret.objects.get(tenant=globex)
    assert (
        crypto.decrypt(tenant_id=globex.pk, name="WANDB_KEY", ciphertext=row.ciphertext)
        == "w-value"
    )
    assert row.created_by.username == "root"
    missing = admin.post(
        "/admin/secrets/secret/add/", {"tenant": globex.pk, "name": "OTHER", "audit_reason": "x"}
    )
    assert missing.status_code == 200 and not Secret.objects.filter(name="OTHER").exists()


def test_an_error_report_of_a_failure_with_a_value_in_hand_shows_no_value(world, monkeypatch):
    """A 500's report (the DEBUG page, an error mail) lists each frame's locals: the functions
    that hold a value hide theirs (sensitive_variables)."""
    tenant = Tenant.objects.get(slug="acme")

    class Broken:
        def encrypt(self, plain):
            raise RuntimeError("disk on fire")

    monkeypatch.setattr(crypto, "fernet", lambda: Broken())
    try:
        secret_create(tenant=tenant, name="NEW_ONE", value=VALUE, user=world[0]["alice"][0])
    except RuntimeError:
        report = ExceptionReporter(None, *sys.exc_info())
        text = report.get_traceback_text() + report.get_traceback_html()
    assert "disk on fire" in text and VALUE not in text


def test_support_staff_see_names_in_the_admin_but_change_nothing(world):
    cast = world[0]
    row = Secret.objects.get()
    support = Client()
    support.force_login(cast["staff"][0])
    listed = support.get("/admin/secrets/secret/")
    assert listed.status_code == 200 and "HF_TOKEN" in listed.content.decode()
    page = support.get(f"/admin/secrets/secret/{row.pk}/change/")
    assert page.status_code == 200 and 'name="new_value"' not in page.content.decode()  # view only
    assert (
        support.post(f"/admin/secrets/secret/{row.pk}/delete/", {"post": "yes"}).status_code == 403
    )
    assert Secret.objects.filter(pk=row.pk).exists()
