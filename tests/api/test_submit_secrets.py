"""A submit's `secrets` must each exist in the submitter's tenant at submit time, else 400
naming `secrets`; another tenant's secret is refused in exactly the words of one that never
was. The job carries the names only; a secret deleted after the submit fails the start (the
agent API's secrets endpoint answers 410: tests/unit/test_agent_secrets.py)."""

import pytest

from apps.jobs.models import Job

SUBMIT = "/api/v1/jobs/"
VALUE = "submit-path-VALUE-31f0"  # noqa: S105 (a test's value)


def job(**fields) -> dict:
    return {"template": "demo-train", "params": {"steps": 3}, "gpus": 1, **fields}


@pytest.fixture
def made(as_user, cast):
    from apps.tenants.models import Membership

    Membership.objects.filter(user=cast["dave"][0]).update(role="admin")  # globex's admin
    alice, dave = as_user("alice"), as_user("dave")
    for client, name in ((alice, "HF_TOKEN"), (alice, "WANDB_KEY"), (dave, "GLOBEX_ONLY")):
        assert (
            client.post(
                "/api/v1/secrets/", {"name": name, "value": VALUE}, format="json"
            ).status_code
            == 201
        )
    return alice, dave


def test_a_submit_naming_existing_secrets_carries_their_names_only(as_user, made):
    response = as_user("bob").post(SUBMIT, job(secrets=["HF_TOKEN", "WANDB_KEY"]), format="json")
    assert response.status_code == 201, response.content
    assert response.json()["secrets"] == ["HF_TOKEN", "WANDB_KEY"]
    assert Job.objects.get(pk=response.json()["id"]).secrets == ["HF_TOKEN", "WANDB_KEY"]
    detail = as_user("bob").get(f"{SUBMIT}{response.json()['id']}/")
    assert (
        detail.json()["secrets"] == ["HF_TOKEN", "WANDB_KEY"]
        and VALUE not in detail.content.decode()
    )


def test_an_unknown_secret_is_400_naming_secrets_and_no_job(as_user, made):
    response = as_user("bob").post(SUBMIT, job(secrets=["HF_TOKEN", "NOPE"]), format="json")
    assert response.status_code == 400
    assert response.json() == {"secrets": ["no secret named NOPE in this tenant"]}
    assert not Job.objects.exists()


def test_another_tenants_secret_answers_exactly_as_an_unknown_one(as_user, made):
    bob = as_user("bob")
    theirs = bob.post(SUBMIT, job(secrets=["GLOBEX_ONLY"]), format="json")
    never = bob.post(SUBMIT, job(secrets=["NEVER_MADE"]), format="json")
    assert theirs.status_code == never.status_code == 400
    assert theirs.json()["secrets"][0].replace("GLOBEX_ONLY", "X") == never.json()["secrets"][
        0
    ].replace("NEVER_MADE", "X")
    dave = as_user("dave").post(SUBMIT, job(secrets=["HF_TOKEN"]), format="json")  # acme's name
    assert dave.status_code == 400 and "secrets" in dave.json()
    assert not Job.objects.exists()


def test_a_deleted_secret_can_no_longer_be_named(as_user, made):
    alice, _ = made
    assert alice.delete("/api/v1/secrets/WANDB_KEY/").status_code == 204
    response = as_user("bob").post(SUBMIT, job(secrets=["WANDB_KEY"]), format="json")
    assert response.status_code == 400 and "WANDB_KEY" in response.json()["secrets"][0]


def test_no_secrets_costs_no_lookup(as_user, made):
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    with CaptureQueriesContext(connection) as queries:
        assert as_user("bob").post(SUBMIT, job(), format="json").status_code == 201
    assert not any("secrets_secret" in q["sql"] for q in queries.captured_queries)
    with CaptureQueriesContext(connection) as queries:
        assert (
            as_user("bob").post(SUBMIT, job(secrets=["HF_TOKEN"]), format="json").status_code == 201
        )
    assert sum("secrets_secret" in q["sql"] for q in queries.captured_queries) == 1


def test_a_secret_cannot_take_a_name_the_platform_sets(as_user):
    for name in ("PATH", "CUDA_VISIBLE_DEVICES", "LD_PRELOAD", "GPUPLATFORM_URL", "MASTER_ADDR"):
        response = as_user("alice").post(
            "/api/v1/secrets/", {"name": name, "value": "v"}, format="json"
        )
        assert response.status_code == 400 and "name" in response.json(), name
