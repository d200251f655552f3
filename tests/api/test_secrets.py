"""`/api/v1/secrets/`: tenant admins create, replace and delete; every member lists names;
values are write-only (only name and dates are ever returned); another tenant's are 404; bad
names and values are 400 naming the field; every change is in the audit log without its value."""

import pytest
from django.contrib.admin.models import LogEntry

from apps.secrets.models import Secret

URL = "/api/v1/secrets/"
VALUE = "sk-live-distinctive-4b1d-VALUE"  # noqa: S105 (a test's value)


def create(client, name="HF_TOKEN", value=VALUE):
    return client.post(URL, {"name": name, "value": value}, format="json")


def test_an_admin_creates_lists_replaces_and_deletes(as_user):
    alice = as_user("alice")
    response = create(alice)
    assert response.status_code == 201
    assert set(response.json()) == {"name", "created_at", "updated_at"}
    assert response.json()["name"] == "HF_TOKEN"
    listed = alice.get(URL).json()
    assert [s["name"] for s in listed["results"]] == ["HF_TOKEN"]
    assert set(listed["results"][0]) == {"name", "created_at", "updated_at"}
    detail = alice.get(f"{URL}HF_TOKEN/")
    assert detail.status_code == 200 and set(detail.json()) == {"name", "created_at", "updated_at"}
    before = Secret.objects.get().ciphertext
    replaced = alice.put(f"{URL}HF_TOKEN/", {"value": "new-value"}, format="json")
    assert replaced.status_code == 200 and set(replaced.json()) == {
        "name",
        "created_at",
        "updated_at",
    }
    assert Secret.objects.get().ciphertext != before
    assert replaced.json()["updated_at"] >= response.json()["updated_at"]
    assert alice.delete(f"{URL}HF_TOKEN/").status_code == 204
    assert not Secret.objects.exists()
    assert alice.get(f"{URL}HF_TOKEN/").status_code == 404


def test_the_row_holds_ciphertext_not_the_value(as_user):
    create(as_user("alice"))
    row = Secret.objects.get()
    assert VALUE not in row.ciphertext and row.ciphertext.startswith("gAAAA")  # a Fernet token
    assert row.created_by.username == row.updated_by.username == "alice"


def test_members_and_viewers_list_names_but_may_not_write(as_user):
    create(as_user("alice"))
    for name in ("bob", "carol"):
        client = as_user(name)
        assert [s["name"] for s in client.get(URL).json()["results"]] == ["HF_TOKEN"]
        assert client.get(f"{URL}HF_TOKEN/").status_code == 200
        assert create(client, name="OTHER").status_code == 403
        assert client.put(f"{URL}HF_TOKEN/", {"value": "x"}, format="json").status_code == 403
        assert client.delete(f"{URL}HF_TOKEN/").status_code == 403
    assert list(Secret.objects.values_list("name", flat=True)) == ["HF_TOKEN"]


def test_no_token_is_401_and_staff_of_no_tenant_403(as_user):
    assert as_user(None).get(URL).status_code == 401
    assert as_user("staff").get(URL).status_code == 403
    assert create(as_user("staff")).status_code == 403


def test_another_tenants_secret_is_404_everywhere(as_user, cast):
    create(as_user("alice"))
    dave = as_user("dave")  # globex
    assert dave.get(URL).json()["results"] == []
    assert dave.get(f"{URL}HF_TOKEN/").status_code == 404
    from apps.tenants.models import Membership

    Membership.objects.filter(user=cast["dave"][0]).update(role="admin")  # even as globex's admin
    assert dave.get(f"{URL}HF_TOKEN/").status_code == 404
    assert dave.put(f"{URL}HF_TOKEN/", {"value": "x"}, format="json").status_code == 404
    assert dave.delete(f"{URL}HF_TOKEN/").status_code == 404
    assert Secret.objects.get().tenant.slug == "acme"
    # globex may have its own of the same name: names are per tenant
    assert create(dave, value="globex's").status_code == 201
    assert Secret.objects.count() == 2


@pytest.mark.parametrize(("body", "field"), [
    ({"name": "lower", "value": "v"}, "name"),
    ({"name": "1START", "value": "v"}, "name"),
    ({"name": "HAS-DASH", "value": "v"}, "name"),
    ({"name": "", "value": "v"}, "name"),
    ({"name": "A" * 129, "value": "v"}, "name"),
    ({"name": 7, "value": "v"}, "name"),
    ({"value": "v"}, "name"),
    ({"name": "OK", "value": "a\x00b"}, "value"),
    ({"name": "OK", "value": "x" * (64 * 1024 + 1)}, "value"),
    ({"name": "OK", "value": "é" * (32 * 1024 + 1)}, "value"),  # characters fit, bytes do not
    ({"name": "OK", "value": 12}, "value"),
    ({"name": "OK", "value": None}, "value"),
    ({"name": "OK", "value": ["v"]}, "value"),
    ({"name": "OK"}, "value"),
    ({"name": "OK", "value": "v", "extra": 1}, "extra"),
])  # fmt: skip
def test_bad_input_is_400_naming_the_field(as_user, body, field):
    response = as_user("alice").post(URL, body, format="json")
    assert response.status_code == 400, response.content
    assert field in response.json()
    assert not Secret.objects.exists()


def test_a_lone_surrogate_or_a_non_object_body_is_400_not_500(as_user):
    alice = as_user("alice")
    response = alice.post(
        URL, '{"name": "OK", "value": "\\ud800"}', content_type="application/json"
    )
    assert response.status_code == 400 and "value" in response.json()
    response = alice.post(URL, "[1]", content_type="application/json")
    assert response.status_code == 400 and "body" in response.json()


def test_the_largest_value_and_an_empty_one_are_accepted(as_user):
    alice = as_user("alice")
    assert create(alice, "BIG", "x" * (64 * 1024)).status_code == 201
    assert create(alice, "EMPTY", "").status_code == 201
    assert create(alice, "PEM", "-----BEGIN KEY-----\nabc\n-----END KEY-----\n").status_code == 201


def test_a_second_create_of_a_name_is_400_naming_it_and_changes_nothing(as_user):
    alice = as_user("alice")
    create(alice)
    before = Secret.objects.get().ciphertext
    response = create(alice, value="other")
    assert response.status_code == 400 and "PUT" in response.json()["name"][0]
    assert Secret.objects.get().ciphertext == before


def test_put_checks_its_value_and_never_renames(as_user):
    alice = as_user("alice")
    create(alice)
    assert alice.put(f"{URL}HF_TOKEN/", {"value": 3}, format="json").json().keys() == {"value"}
    response = alice.put(f"{URL}HF_TOKEN/", {"name": "OTHER", "value": "v"}, format="json")
    assert response.status_code == 400 and "name" in response.json()
    assert (
        alice.put(f"{URL}HF_TOKEN/", {"name": "HF_TOKEN", "value": "v"}, format="json").status_code
        == 200
    )
    assert (
        alice.put(f"{URL}NOPE/", {"value": "v"}, format="json").status_code == 404
    )  # PUT replaces
    assert alice.patch(f"{URL}HF_TOKEN/", {"value": "v"}, format="json").status_code == 405


def test_every_change_is_in_the_audit_log_without_the_value(as_user):
    alice = as_user("alice")
    create(alice)
    alice.put(f"{URL}HF_TOKEN/", {"value": VALUE + "-2"}, format="json")
    alice.delete(f"{URL}HF_TOKEN/")
    entries = list(LogEntry.objects.order_by("pk"))
    assert [(e.user.username, e.action_flag, e.object_repr) for e in entries] == [
        ("alice", 1, "acme/HF_TOKEN"), ("alice", 2, "acme/HF_TOKEN"), ("alice", 3, "acme/HF_TOKEN"),
    ]  # fmt: skip
    assert all(VALUE not in e.change_message for e in entries)


def test_only_json_bodies_are_taken(as_user):
    response = as_user("alice").post(URL, {"name": "FORM", "value": VALUE})  # multipart
    assert response.status_code == 415 and not Secret.objects.exists()


def test_the_document_marks_the_value_write_only_and_never_answers_it(as_user):
    document = as_user(None).get("/api/schema/", {"format": "json"}).json()
    schemas = document["components"]["schemas"]
    for name in ("SecretCreate", "SecretReplace"):
        assert schemas[name]["properties"]["value"]["writeOnly"] is True
    assert set(schemas["Secret"]["properties"]) == {"name", "created_at", "updated_at"}
    post = document["paths"]["/api/v1/secrets/"]["post"]
    assert set(post["requestBody"]["content"]) == {"application/json"}
    assert {"201", "400", "403"} <= set(post["responses"])
    for method in ("get", "put", "delete"):
        assert "404" in document["paths"]["/api/v1/secrets/{name}/"][method]["responses"]
