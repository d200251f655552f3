"""/tokens/: a user lists, makes (key shown once) and revokes their own API tokens."""

import re

from apps.tenants.models import ApiToken
from tests.factories import client_for


def test_a_user_makes_a_token_sees_it_once_and_revokes_it(browser_as, cast):
    bob = browser_as("bob")
    page = bob.get("/tokens/")
    assert page.status_code == 200 and b"default" in page.content  # the cast's token, by name
    made = bob.post("/tokens/", {"name": "laptop", "days": "30"})
    assert made.status_code == 200 and made["Cache-Control"] == "no-store"
    key = re.search(rb'<code id="new-token">([^<]+)</code>', made.content).group(1).decode()
    assert client_for(key).get("/api/v1/usage/").status_code == 200
    again = bob.get("/tokens/")
    assert key.encode() not in again.content and b"laptop" in again.content  # shown once only
    token = ApiToken.objects.get(user=cast["bob"][0], name="laptop")
    assert bob.post(f"/tokens/{token.pk}/revoke/").status_code == 302
    assert client_for(key).get("/api/v1/usage/").status_code == 401
    assert (
        client_for(cast["bob"][1]).get("/api/v1/usage/").status_code == 200
    )  # the other one still works


def test_bad_input_is_a_400_naming_the_field_and_anothers_token_a_404(browser_as, cast):
    bob = browser_as("bob")
    bad = bob.post("/tokens/", {"name": "", "days": "12345"})
    assert (
        bad.status_code == 400 and bad.content.count(b"errorlist") >= 2
    )  # name and days each said
    daves = ApiToken.objects.get(user=cast["dave"][0])
    assert bob.post(f"/tokens/{daves.pk}/revoke/").status_code == 404
    assert client_for(cast["dave"][1]).get("/api/v1/usage/").status_code == 200
    assert browser_as(None).get("/tokens/").status_code == 302  # anonymous: to the login page
    assert bob.get(f"/tokens/{daves.pk}/revoke/").status_code == 405
