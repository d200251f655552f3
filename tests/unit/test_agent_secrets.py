"""The agent API's secrets endpoint (`GET /internal/agent/v1/members/<attempt>/<rank>/secrets/`):
the values of the job's own secrets, only to the node its live member is placed on, with the
attempt's token; 404 for anything else; 410 naming a secret deleted after the submit."""

import pytest
from rest_framework.exceptions import NotFound

from apps.jobs import services
from apps.jobs.models import AttemptMember, Job
from apps.nodes import agent_api
from apps.nodes.credentials import issue_credential
from apps.secrets.services import secret_create, secret_delete
from apps.tenants.models import Tenant
from tests.factories import make_cast, make_node
from tests.unit.test_agent_api import bearer, fenced, member_url
from tests.unit.test_dispatcher import placed_and_started

VALUE = "hf_s3cr3t-VALUE-9f2c"  # noqa: S105 (a test's value)


@pytest.fixture
def placed(db):
    cast = make_cast()
    make_node("h1", gpus=1)
    make_node("h2", gpus=1)
    acme, globex = Tenant.objects.get(slug="acme"), Tenant.objects.get(slug="globex")
    alice = cast["alice"][0]
    secret_create(tenant=acme, name="HF_TOKEN", value=VALUE, user=alice)
    secret_create(tenant=acme, name="UNUSED", value="not-for-this-job", user=alice)
    secret_create(tenant=globex, name="HF_TOKEN", value="globex-value", user=cast["dave"][0])
    job, attempt = placed_and_started(cast)
    Job.objects.filter(pk=job.pk).update(secrets=["HF_TOKEN"])
    assert attempt.members.get().node.name == "h1"
    mine = bearer(issue_credential(node_name="h1")[1])
    other = bearer(issue_credential(node_name="h2")[1])
    return cast, job, attempt, mine, other


def test_the_placed_node_gets_only_the_jobs_own_secrets_not_cached(placed):
    _, _, attempt, mine, _ = placed
    response = mine.get(member_url(attempt, "secrets/"), **fenced(attempt))
    assert response.status_code == 200
    assert response.json() == {"secrets": {"HF_TOKEN": VALUE}}  # not UNUSED, not globex's
    assert response["Cache-Control"] == "no-store"


def test_the_assignment_carries_the_names_only(placed):
    _, _, attempt, mine, _ = placed
    work = mine.get(member_url(attempt), **fenced(attempt))
    assert work.json()["secrets"] == ["HF_TOKEN"] and VALUE not in work.content.decode()


def test_a_job_with_no_secrets_gets_an_empty_map(placed):
    _, job, attempt, mine, _ = placed
    Job.objects.filter(pk=job.pk).update(secrets=[])
    assert mine.get(member_url(attempt, "secrets/"), **fenced(attempt)).json() == {"secrets": {}}


def test_another_nodes_credential_or_a_wrong_token_is_404(placed):
    _, _, attempt, mine, other = placed
    url = member_url(attempt, "secrets/")
    assert other.get(url, **fenced(attempt)).status_code == 404
    wrong = "00000000-0000-0000-0000-000000000000"
    assert mine.get(url, **fenced(attempt, token=wrong)).status_code == 404
    assert mine.get(url, **fenced(attempt, token="x")).status_code == 404
    assert mine.get(url).status_code == 404  # no token at all
    assert (
        mine.get(
            f"/internal/agent/v1/members/{attempt.pk}/1/secrets/", **fenced(attempt)
        ).status_code
        == 404
    )
    assert bearer("gpn_nope.nope").get(url, **fenced(attempt)).status_code == 401
    for response in (
        other.get(url, **fenced(attempt)),
        mine.get(url, **fenced(attempt, token=wrong)),
    ):
        assert VALUE not in response.content.decode()


def test_an_ended_attempt_is_404(placed):
    _, job, attempt, mine, _ = placed
    assert services.attempt_member_finished(attempt_id=attempt.pk, rank=0, token=str(attempt.token),
                                            exit_code=0, reason="", checkpoint="")  # fmt: skip
    attempt.refresh_from_db()
    assert attempt.state == "succeeded"
    response = mine.get(member_url(attempt, "secrets/"), **fenced(attempt))
    assert response.status_code == 404
    assert VALUE not in response.content.decode()


def test_a_member_told_to_stop_is_404(placed):
    """Cancelled: the attempt is still active until its processes are reported gone, but it is
    not to start any more, so its secrets are not handed out."""
    _, job, attempt, mine, _ = placed
    services.job_cancel(job=job, actor="test")
    attempt.refresh_from_db()
    assert attempt.state == "running" and attempt.stop_requested == "cancel"
    response = mine.get(member_url(attempt, "secrets/"), **fenced(attempt))
    assert response.status_code == 404 and VALUE not in response.content.decode()


def test_one_liveness_rule_refuses_a_member_told_to_stop_its_secrets_only(placed):
    """`_live` is every member endpoint's rule; secrets alone refuse a member told to stop too
    (its bundle and inputs stay served: the agent would read their 404 as the job's failure)."""
    _, job, attempt, mine, _ = placed
    services.job_cancel(job=job, actor="test")
    member = AttemptMember.objects.select_related("attempt").get(attempt=attempt)
    assert agent_api._live(member) is member
    with pytest.raises(NotFound):
        agent_api._live(member, stopping=False)
    assert mine.get(member_url(attempt, "inputs/"), **fenced(attempt)).status_code == 200
    assert mine.get(member_url(attempt, "secrets/"), **fenced(attempt)).status_code == 404


def test_a_secret_deleted_after_the_submit_is_410_naming_it(placed):
    cast, job, attempt, mine, _ = placed
    Job.objects.filter(pk=job.pk).update(secrets=["HF_TOKEN", "WANDB_KEY"])
    response = mine.get(member_url(attempt, "secrets/"), **fenced(attempt))
    assert response.status_code == 410
    assert response.json() == {
        "missing": ["WANDB_KEY"],
        "detail": "secret WANDB_KEY no longer exists",
    }
    assert VALUE not in response.content.decode()  # none of the values when one is missing
    assert response["Cache-Control"] == "no-store"
    from apps.secrets.models import Secret

    secret_delete(
        secret=Secret.objects.get(tenant__slug="acme", name="HF_TOKEN"), user=cast["alice"][0]
    )
    response = mine.get(member_url(attempt, "secrets/"), **fenced(attempt))
    assert response.status_code == 410 and response.json()["missing"] == ["HF_TOKEN", "WANDB_KEY"]


def test_a_secret_no_key_decrypts_is_409_not_500(placed, settings):
    _, _, attempt, mine, _ = placed
    from cryptography.fernet import Fernet

    settings.SECRET_ENCRYPTION_KEYS = [Fernet.generate_key().decode()]  # the derived key is gone
    response = mine.get(member_url(attempt, "secrets/"), **fenced(attempt))
    assert response.status_code == 409
    assert "HF_TOKEN" in response.json()["detail"] and VALUE not in response.content.decode()
