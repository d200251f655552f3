"""/secrets/: every member of a tenant sees its secrets' names; tenant admins add, replace and
delete them; a value never comes back into a page; another tenant's secret is a 404."""

from apps.secrets.models import Secret
from apps.secrets.services import secret_values

VALUE = "page-typed-VALUE-55aa"  # noqa: S105 (a test's value)


def value_of(name="HF_TOKEN"):
    secret = Secret.objects.get(name=name, tenant__slug="acme")
    return secret_values(tenant_id=secret.tenant_id, names=[name])[0][name]


def test_an_admin_adds_replaces_and_deletes_and_the_value_never_shows(browser_as):
    alice = browser_as("alice")
    assert alice.get("/secrets/").status_code == 200
    made = alice.post("/secrets/", {"name": "HF_TOKEN", "value": VALUE}, follow=True)
    assert made.status_code == 200 and b"HF_TOKEN" in made.content
    assert VALUE.encode() not in made.content
    assert value_of() == VALUE
    bad = alice.post("/secrets/", {"name": "bad-name", "value": VALUE})
    assert bad.status_code == 400 and b"errorlist" in bad.content
    assert VALUE.encode() not in bad.content  # not put back into the form
    again = alice.post("/secrets/", {"name": "HF_TOKEN", "value": "other"})
    assert again.status_code == 400 and value_of() == VALUE  # exists already: not replaced
    replaced = alice.post("/secrets/HF_TOKEN/replace/", {"value": VALUE + "-2"}, follow=True)
    assert replaced.status_code == 200 and VALUE.encode() not in replaced.content
    assert value_of() == VALUE + "-2"
    assert alice.post("/secrets/HF_TOKEN/delete/").status_code == 302
    assert not Secret.objects.exists()


def test_members_and_viewers_see_names_only_and_may_not_change(browser_as):
    browser_as("alice").post("/secrets/", {"name": "HF_TOKEN", "value": VALUE})
    for name in ("bob", "carol"):
        client = browser_as(name)
        page = client.get("/secrets/")
        assert page.status_code == 200 and b"HF_TOKEN" in page.content
        assert VALUE.encode() not in page.content and b"Add secret" not in page.content
        assert client.post("/secrets/", {"name": "OTHER", "value": "v"}).status_code == 403
        assert client.post("/secrets/HF_TOKEN/replace/", {"value": "v"}).status_code == 403
        assert client.post("/secrets/HF_TOKEN/delete/").status_code == 403
    assert value_of() == VALUE


def test_another_tenants_secret_is_404_and_anonymous_goes_to_sign_in(browser_as, cast):
    browser_as("alice").post("/secrets/", {"name": "ACME_ONLY", "value": VALUE})
    dave = browser_as("dave")
    page = dave.get("/secrets/")
    assert page.status_code == 200 and b"ACME_ONLY" not in page.content
    assert dave.post("/secrets/ACME_ONLY/replace/", {"value": "v"}).status_code == 404
    assert dave.post("/secrets/ACME_ONLY/delete/").status_code == 404
    assert browser_as(None).get("/secrets/").status_code == 302
    assert browser_as("staff").get("/secrets/").status_code == 404  # staff of no tenant
    assert value_of("ACME_ONLY") == VALUE
