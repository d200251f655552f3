"""The submit page's "your own code": a command, and optionally a zip of its working directory,
stored as a bundle the way the API stores one and submitted with it (docs/own-code.md)."""

from __future__ import annotations

import hashlib
import io
import zipfile

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile

from apps.bundles.models import Bundle
from apps.jobs.models import Job
from apps.tenants.models import Tenant

BASE = {"template": "demo-train", "param_steps": "5", "param_step_seconds": "0.2", "gpus": "1",
        "nodes": "1", "gpu_sku": "H100-80GB"}  # fmt: skip


@pytest.fixture(autouse=True)
def storage(settings, tmp_path):
    settings.MEDIA_ROOT = tmp_path


def workdir_zip(text: bytes = b"print('hi')\n") -> bytes:
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w") as archive:
        archive.writestr("train.py", text)
        archive.writestr("data/points.csv", "1,2\n")
    return out.getvalue()


def post(client, data: bytes | None = None, name: str = "work.zip", **fields):
    form = {**BASE, **fields}
    if data is not None:
        form["workdir"] = SimpleUploadedFile(name, data, content_type="application/zip")
    return client.post("/jobs/new/", form)


def test_a_command_with_a_zip_submits_a_job_in_that_bundle(browser_as):
    data = workdir_zip()
    response = post(browser_as("bob"), data, command="python train.py --lr '3e-4'")
    assert response.status_code == 302, response.content.decode()[:3000]
    job = Job.objects.get()
    assert job.command == ["python", "train.py", "--lr", "3e-4"]
    assert job.template is None and job.params == {}
    assert job.bundle == hashlib.sha256(data).hexdigest()
    bundle = Bundle.objects.get()
    assert (bundle.sha256, bundle.size, bundle.content_type) == (job.bundle, len(data), "zip")
    # the same directory again: the same bundle, nothing new stored
    assert post(browser_as("bob"), data, command="python train.py").status_code == 302
    assert Bundle.objects.count() == 1 and Job.objects.count() == 2
    page = browser_as("bob").get(f"/jobs/{job.pk}/").content.decode()
    assert f'bundle <code title="{job.bundle}">{job.bundle[:12]}</code>' in page


def test_a_tar_gz_works_too(browser_as):
    import tarfile

    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w:gz") as archive:
        info = tarfile.TarInfo("train.py")
        info.size = 3
        archive.addfile(info, io.BytesIO(b"x=1"))
    response = post(
        browser_as("bob"), out.getvalue(), name="work.tar.gz", command="python train.py"
    )
    assert response.status_code == 302
    assert Bundle.objects.get().content_type == "gzip"


def test_a_zip_without_a_command_is_refused_on_the_form(browser_as):
    response = post(browser_as("bob"), workdir_zip())
    assert response.status_code == 400
    assert "give the command to run" in response.content.decode()
    assert not Job.objects.exists() and not Bundle.objects.exists()


def test_a_file_that_is_no_archive_is_refused_naming_it(browser_as):
    response = post(browser_as("bob"), b"just some text", name="notes.zip", command="python x.py")
    assert response.status_code == 400
    assert "not a zip archive" in response.content.decode()
    assert not Job.objects.exists()


def test_over_the_cap_the_form_names_the_cap_and_the_size(browser_as):
    Tenant.objects.filter(slug="acme").update(bundle_max_mib=1)
    data = b"PK\x03\x04" + bytes(1024 * 1024 + 100)
    response = post(browser_as("bob"), data, command="python train.py")
    page = response.content.decode()
    assert response.status_code == 400
    assert "1 MiB" in page and str(len(data)) in page
    assert not Bundle.objects.exists()


def test_a_tenant_without_commands_may_run_its_own_directory_only(browser_as):
    refused = post(browser_as("dave"), None, command="python train.py")
    assert refused.status_code == 400
    assert "may only run templates" in refused.content.decode()
    response = post(browser_as("dave"), workdir_zip(), command="python train.py")
    assert response.status_code == 302, response.content.decode()[:3000]
    assert Job.objects.get().tenant.slug == "globex"


def test_a_badly_quoted_command_is_refused(browser_as):
    response = post(browser_as("bob"), None, command="python 'train.py")
    assert response.status_code == 400
    assert "cannot split" in response.content.decode()


def test_the_page_offers_the_upload(browser_as):
    page = browser_as("bob").get("/jobs/new/").content.decode()
    assert 'enctype="multipart/form-data"' in page
    assert 'name="workdir"' in page and 'name="command"' in page
