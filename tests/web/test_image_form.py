"""The submit page's image (docs/images.md): an `image` and an `image_pull_secret` beside the
command, submitted as the API's fields (an image alone runs its own Cmd); the API's refusals on
those fields shown at them; the job page showing the image and, once pulled, its digest."""

from __future__ import annotations

import pytest

from apps.jobs.models import Job
from apps.secrets.services import secret_create

REGISTRY = "registry.example.com:5000"
IMAGE = f"{REGISTRY}/team/train:v3"
DIGEST = "sha256:" + "c3" * 32
BASE = {"template": "demo-train", "param_steps": "5", "gpus": "1", "nodes": "1",
        "gpu_sku": "H100-80GB"}  # fmt: skip


@pytest.fixture(autouse=True)
def registries(settings):
    settings.IMAGE_REGISTRIES = [REGISTRY]


def post(client, **fields):
    return client.post("/jobs/new/", {**BASE, **fields})


def test_the_form_has_the_image_fields(browser_as):
    page = browser_as("bob").get("/jobs/new/").content.decode()
    assert 'name="image"' in page and 'name="image_pull_secret"' in page


def test_an_image_with_a_command_and_a_pull_secret(browser_as, cast):
    secret_create(tenant=cast["bob"][0].membership.tenant, name="REG", value="robot:pw",
                  user=cast["alice"][0])  # fmt: skip
    response = post(browser_as("bob"), command="python train.py", image=IMAGE,
                    image_pull_secret="REG")  # fmt: skip
    assert response.status_code == 302, response.content.decode()[:3000]
    job = Job.objects.get()
    assert (job.image, job.image_pull_secret, job.command) == (IMAGE, "REG", ["python", "train.py"])
    assert job.template is None
    page = browser_as("bob").get(f"/jobs/{job.pk}/").content.decode()
    assert f"<code>{IMAGE}</code>" in page and "with secret <code>REG</code>" in page
    assert "digest: fixed at its first pull" in page
    Job.objects.filter(pk=job.pk).update(image_digest=DIGEST)
    page = browser_as("bob").get(f"/jobs/{job.pk}/").content.decode()
    assert f'<code id="image-digest">{DIGEST}</code>' in page


def test_an_image_alone_runs_its_own_cmd(browser_as):
    response = post(browser_as("bob"), image=IMAGE)
    assert response.status_code == 302, response.content.decode()[:3000]
    job = Job.objects.get()
    assert job.image == IMAGE and job.template is None and job.command == []
    page = browser_as("bob").get(f"/jobs/{job.pk}/").content.decode()
    assert (
        "the image&#x27;s own <code>Cmd</code>" in page
        or "the image's own <code>Cmd</code>" in page
    )


@pytest.mark.parametrize(
    ("fields", "where", "said"),
    [
        ({"image": "evil.example.com/team/x:1"}, "image", "evil.example.com"),
        ({"image": "no-host-here"}, "image", "registry host"),
        ({"image": IMAGE, "image_pull_secret": "NOPE"}, "image_pull_secret", "NOPE"),
        ({"image_pull_secret": "REG", "command": "true"}, "image_pull_secret", ""),
    ],
)
def test_the_apis_refusals_are_shown_at_the_field(browser_as, fields, where, said):
    response = post(browser_as("bob"), **fields)
    assert response.status_code == 400  # the form again, its errors at their fields
    page = response.content.decode()
    assert not Job.objects.exists()
    start = page.index(f'name="{where}"')
    shown = page[start : page.index("</ul>", start) + 5]
    assert '<ul class="errorlist">' in shown and said in shown and "<label" not in shown, shown
