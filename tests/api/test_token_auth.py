"""API tokens (apps/tenants/auth.py): DRF's TokenAuthentication with its lookup as one statement,
and for a submit the same statement also reads the submitter. Same answers as DRF's own: 401
for a missing, unknown or inactive user's token; the submitter's membership as the view reads it."""

import json

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from rest_framework.test import APIClient

from apps.jobs.models import Job
from apps.tenants.auth import PEEK_LIMIT
from apps.tenants.models import ApiToken
from apps.tenants.tokens import digest_of
from tests.factories import client_for

GOOD = {"template": "demo-train", "params": {"steps": 3}, "gpus": 1, "gpu_sku": "H100-80GB"}


@pytest.mark.parametrize("method", ["get", "post"])
def test_an_unknown_or_missing_token_gets_401_on_every_route(cast, method):
    for client in (client_for("not-a-token"), client_for(None)):
        response = getattr(client, method)("/api/v1/jobs/", GOOD, format="json")
        assert response.status_code == 401, response.content
    assert not Job.objects.exists()


@pytest.mark.parametrize("method", ["get", "post"])
def test_an_inactive_users_token_gets_401(cast, method):
    bob, key = cast["bob"]
    bob.is_active = False
    bob.save(update_fields=["is_active"])
    response = getattr(client_for(key), method)("/api/v1/jobs/", GOOD, format="json")
    assert response.status_code == 401
    assert response.json()["detail"] == "User inactive or deleted."
    assert not Job.objects.exists()


def test_the_token_is_the_requests_auth_as_with_drfs_class(cast):
    _, key = cast["bob"]
    response = client_for(key).get("/api/v1/usage/")
    assert response.status_code == 200 and response.json()["tenant"] == "acme"
    assert ApiToken.objects.filter(digest=digest_of(key), user=cast["bob"][0]).exists()


def test_a_submit_reads_token_user_and_membership_in_one_statement(as_user):
    with CaptureQueriesContext(connection) as ctx:
        response = as_user("bob").post("/api/v1/jobs/", GOOD, format="json")
    assert response.status_code == 201, response.content
    reads = [q["sql"] for q in ctx.captured_queries]
    token_reads = [
        sql
        for sql in reads
        if "tenants_apitoken" in sql and sql.lstrip().upper().startswith("SELECT")
    ]
    assert len(token_reads) == 1 and "tenants_membership" in token_reads[0], reads
    assert sum("tenants_membership" in sql for sql in reads) == 1, (
        reads
    )  # not read again by the view


def test_who_may_submit_is_decided_from_that_read(as_user, cast):
    assert (
        as_user("carol").post("/api/v1/jobs/", GOOD, format="json").status_code == 403
    )  # a viewer
    response = as_user("staff").post("/api/v1/jobs/", GOOD, format="json")
    assert response.status_code == 403 and "no tenant" in response.json()["detail"]
    created = as_user("dave").post("/api/v1/jobs/", GOOD, format="json").json()
    assert created["tenant"] == "globex" and created["user"] == "dave"


def test_a_body_read_ahead_of_parsing_changes_no_answer(as_user):
    bob = as_user("bob")
    broken = bob.post("/api/v1/jobs/", "{not json", content_type="application/json")
    assert broken.status_code == 400 and "JSON parse error" in str(broken.json())
    listed = bob.post("/api/v1/jobs/", [GOOD], format="json")
    assert listed.status_code == 400
    unknown = bob.post("/api/v1/jobs/", {**GOOD, "template": "no-such"}, format="json")
    assert unknown.status_code == 400 and "template" in unknown.json()
    # A body too large to read ahead: its template and SKU are read by the view instead.
    padded = json.dumps(GOOD) + " " * PEEK_LIMIT
    created = bob.post("/api/v1/jobs/", padded, content_type="application/json")
    assert created.status_code == 201 and created.json()["template"] == "demo-train"
    form = bob.post(
        "/api/v1/jobs/", {"template": "no-such", "gpus": 1}
    )  # multipart: not read ahead either
    assert form.status_code == 400 and "template" in form.json()


def test_a_session_signed_in_user_submits_as_before(cast):
    client = APIClient()
    client.force_login(cast["bob"][0])
    response = client.post("/api/v1/jobs/", GOOD, format="json")
    assert response.status_code == 201 and response.json()["user"] == "bob"
