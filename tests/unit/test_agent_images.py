"""The agent API's image endpoint (`/internal/agent/v1/members/<attempt>/<rank>/image/`): the
pull secret's value to the placed node's live member only (no-store; 410 once deleted), and the
digest fixed by the first report (a later one changes nothing)."""

import pytest

from apps.jobs.models import Job
from apps.nodes.credentials import issue_credential
from apps.secrets.models import Secret
from apps.secrets.services import secret_create, secret_delete
from apps.tenants.models import Tenant
from tests.factories import make_cast, make_node
from tests.unit.test_agent_api import bearer, fenced, member_url
from tests.unit.test_dispatcher import placed_and_started

VALUE = "robot:pull-VALUE-5e1a"  # noqa: S105 (a test's value)
FIRST, SECOND = "sha256:" + "a1" * 32, "sha256:" + "b2" * 32


@pytest.fixture
def placed(db):
    cast = make_cast()
    make_node("h1", gpus=1)
    make_node("h2", gpus=1)
    acme = Tenant.objects.get(slug="acme")
    secret_create(tenant=acme, name="REG", value=VALUE, user=cast["alice"][0])
    job, attempt = placed_and_started(cast)
    Job.objects.filter(pk=job.pk).update(image="127.0.0.1:5000/x/y:1", image_pull_secret="REG")
    mine = bearer(issue_credential(node_name="h1")[1])
    other = bearer(issue_credential(node_name="h2")[1])
    return cast, job, attempt, mine, other


def test_the_placed_node_gets_the_pull_secret_not_cached(placed):
    _, _, attempt, mine, other = placed
    response = mine.get(member_url(attempt, "image/"), **fenced(attempt))
    assert response.status_code == 200 and response.json() == {"auth": VALUE}
    assert response["Cache-Control"] == "no-store"
    refused = other.get(member_url(attempt, "image/"), **fenced(attempt))
    assert refused.status_code == 404 and VALUE not in refused.content.decode()
    work = mine.get(member_url(attempt), **fenced(attempt))
    assert work.json()["image_auth"] is True and VALUE not in work.content.decode()


def test_without_a_pull_secret_auth_is_null(placed):
    _, job, attempt, mine, _ = placed
    Job.objects.filter(pk=job.pk).update(image_pull_secret="")
    assert mine.get(member_url(attempt, "image/"), **fenced(attempt)).json() == {"auth": None}


def test_a_deleted_pull_secret_is_410(placed):
    cast, _, attempt, mine, _ = placed
    secret_delete(secret=Secret.objects.get(name="REG"), user=cast["alice"][0])
    response = mine.get(member_url(attempt, "image/"), **fenced(attempt))
    assert response.status_code == 410 and "REG" in response.json()["detail"]


def test_the_first_reported_digest_is_fixed(placed):
    _, job, attempt, mine, other = placed
    url = member_url(attempt, "image/")
    assert mine.post(url, {"digest": FIRST}, format="json", **fenced(attempt)).json() == {
        "image_digest": FIRST
    }
    again = mine.post(url, {"digest": SECOND}, format="json", **fenced(attempt))
    assert again.json() == {"image_digest": FIRST}
    assert Job.objects.get(pk=job.pk).image_digest == FIRST
    assert other.post(url, {"digest": SECOND}, format="json", **fenced(attempt)).status_code == 404
    bad = mine.post(url, {"digest": "sha256:xyz"}, format="json", **fenced(attempt))
    assert bad.status_code == 400 and "digest" in bad.json()
    work = mine.get(member_url(attempt), **fenced(attempt))
    assert work.json()["image_digest"] == FIRST
