"""Images (docs/images.md) at submit: `image` from an allowed registry only, well formed, with a
command or as the image's own Cmd; `image_pull_secret` an existing tenant secret; each refusal a
400 naming its field. The job shows `image` and `image_digest`; the node's assignment carries
them; the agent API hands the pull secret's value to the placed node only and fixes the digest
at the first report (tests/unit/test_agent_images.py)."""

from __future__ import annotations

import pytest

from apps.jobs.models import Job, JobAttempt
from apps.jobs.selectors import assignment_of
from tests.factories import client_for

SUBMIT = "/api/v1/jobs/"
IMAGE = "127.0.0.1:5000/team/busybox:v1"
PINNED = "127.0.0.1:5000/team/busybox@sha256:" + "ab" * 32
VALUE = "robot:pull-pass-VALUE-77"  # noqa: S105 (a test's value)


@pytest.fixture(autouse=True)
def registries(settings):
    settings.IMAGE_REGISTRIES = ["127.0.0.1:5000", "registry.example.com"]


def cmd(**fields) -> dict:
    return {"command": ["sh", "-c", "echo hi"], "gpus": 0, **fields}


BAD = [
    ("no-host", cmd(image="busybox"), "image"),
    ("uppercase-repo", cmd(image="registry.example.com/Team/x"), "image"),
    ("bad-tag", cmd(image="registry.example.com/x:t@g"), "image"),
    ("short-digest", cmd(image="registry.example.com/x@sha256:abc"), "image"),
    ("bad-port", cmd(image="registry.example.com:99999/x"), "image"),
    ("number", cmd(image=5), "image"),
    ("not-allowed", cmd(image="docker.io/library/busybox:latest"), "image"),
    ("other-port", cmd(image="127.0.0.1:5001/team/busybox"), "image"),
    ("with-template", {"template": "demo-train", "params": {"steps": 1}, "image": IMAGE}, "image"),
    ("requirements", cmd(image=IMAGE, python={"requirements": ["numpy"]}), "python"),
    ("secret-no-image", cmd(image_pull_secret="REGISTRY"), "image_pull_secret"),
    ("secret-bad-name", cmd(image=IMAGE, image_pull_secret="not a name"), "image_pull_secret"),
    ("secret-unknown", cmd(image=IMAGE, image_pull_secret="NOPE"), "image_pull_secret"),
]


@pytest.mark.parametrize(("case", "data", "field"), BAD, ids=[case for case, _, _ in BAD])
def test_a_bad_image_field_is_400_naming_it(as_user, case, data, field):
    response = as_user("bob").post(SUBMIT, data, format="json")
    assert response.status_code == 400, response.content
    assert field in response.json(), response.json()
    assert not Job.objects.exists()


def test_the_allow_list_400_names_the_registry_and_what_is_allowed(as_user):
    response = as_user("bob").post(SUBMIT, cmd(image="evil.example.org/x:1"), format="json")
    assert response.status_code == 400
    (message,) = response.json()["image"]
    assert "evil.example.org" in message and "registry.example.com" in message


def test_no_registries_configured_refuses_every_image(as_user, settings):
    settings.IMAGE_REGISTRIES = []
    response = as_user("bob").post(SUBMIT, cmd(image=IMAGE), format="json")
    assert response.status_code == 400 and "not enabled" in response.json()["image"][0]


def test_an_image_job_shows_image_and_an_empty_digest_until_pulled(as_user):
    response = as_user("bob").post(SUBMIT, cmd(image=PINNED), format="json")
    assert response.status_code == 201, response.content
    body = response.json()
    assert body["image"] == PINNED and body["image_digest"] == ""
    assert body["image_pull_secret"] == ""  # a secret's name (like `secrets`), never its value
    detail = as_user("bob").get(f"{SUBMIT}{body['id']}/").json()
    assert detail["image"] == PINNED and detail["image_digest"] == ""


def test_an_image_without_a_command_runs_its_cmd_and_is_named_after_it(as_user):
    response = as_user("bob").post(SUBMIT, {"image": IMAGE, "gpus": 0}, format="json")
    assert response.status_code == 201, response.content
    job = Job.objects.get(pk=response.json()["id"])
    assert job.command == [] and job.name == "busybox" and job.template is None


def test_an_image_without_a_command_is_still_a_command_for_allow_commands(as_user):
    response = as_user("dave").post(SUBMIT, {"image": IMAGE, "gpus": 0}, format="json")
    assert response.status_code == 403, response.content  # globex may run templates only


def test_neither_template_command_nor_image_is_still_refused(as_user):
    response = as_user("bob").post(SUBMIT, {"gpus": 0}, format="json")
    assert response.status_code == 400 and "template" in response.json()


def test_a_pull_secret_is_checked_in_the_submitters_tenant_and_named_on_the_job(as_user, cast):
    from apps.tenants.models import Membership

    Membership.objects.filter(user=cast["dave"][0]).update(role="admin")
    made = as_user("dave").post(
        "/api/v1/secrets/", {"name": "GLOBEX_REG", "value": VALUE}, format="json"
    )
    assert made.status_code == 201
    theirs = as_user("bob").post(
        SUBMIT, cmd(image=IMAGE, image_pull_secret="GLOBEX_REG"), format="json"
    )
    assert theirs.status_code == 400
    assert theirs.json() == {"image_pull_secret": ["no secret named GLOBEX_REG in this tenant"]}
    as_user("alice").post("/api/v1/secrets/", {"name": "REG", "value": VALUE}, format="json")
    response = as_user("bob").post(SUBMIT, cmd(image=IMAGE, image_pull_secret="REG"), format="json")
    assert response.status_code == 201, response.content
    assert VALUE not in response.content.decode()
    assert response.json()["image_pull_secret"] == "REG"


def test_the_assignment_carries_the_image_and_auth_flag_never_the_password(as_user):
    as_user("alice").post("/api/v1/secrets/", {"name": "REG", "value": VALUE}, format="json")
    response = as_user("bob").post(SUBMIT, cmd(image=IMAGE, image_pull_secret="REG"), format="json")
    job = Job.objects.get(pk=response.json()["id"])
    Job.objects.filter(pk=job.pk).update(image_digest="sha256:" + "cd" * 32)
    job.refresh_from_db()
    work = assignment_for_job(job)
    assert work.image == IMAGE and work.image_digest == "sha256:" + "cd" * 32
    assert work.image_auth is True and VALUE not in repr(work)


class Leader:
    labels: dict = {}  # noqa: RUF012 (read only)
    hostname = "h1"


def assignment_for_job(job):
    attempt = JobAttempt(job=job, number=1, pk=1)
    return assignment_of(
        job, attempt, rank=0, gpu_indices=[], world_size=1, leader=Leader, active=True
    )


def test_unauthenticated_submit_with_an_image_is_still_401(db):
    assert client_for(None).post(SUBMIT, cmd(image=IMAGE), format="json").status_code == 401
