"""`/api/v1/bundles/`: uploads streamed into storage under their digest, deduplicated per tenant,
capped (413 naming the cap and the size), a tenant's own (another's is 404), retention; and the
agent API's `members/<attempt>/<rank>/bundle/` (docs/own-code.md)."""

from __future__ import annotations

import hashlib
import io
import os
import tarfile
import tracemalloc
import zipfile
from datetime import timedelta

import pytest
from django.core.files.storage import default_storage
from django.core.handlers.wsgi import WSGIRequest
from django.core.management import call_command
from django.test import RequestFactory
from django.utils import timezone

from apps.bundles import services
from apps.bundles.api import BundleViewSet
from apps.bundles.models import Bundle
from apps.jobs.models import Job
from apps.tenants.models import Tenant

URL = "/api/v1/bundles/"


@pytest.fixture(autouse=True)
def storage(settings, tmp_path):
    settings.MEDIA_ROOT = tmp_path
    return tmp_path


def tar_gz(files: dict[str, bytes] | None = None) -> bytes:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w:gz") as archive:
        for name, data in (files or {"train.py": b"print('hi')\n"}).items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            archive.addfile(info, io.BytesIO(data))
    return out.getvalue()


def a_zip(files: dict[str, bytes] | None = None) -> bytes:
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w") as archive:
        for name, data in (files or {"train.py": b"print('hi')\n"}).items():
            archive.writestr(name, data)
    return out.getvalue()


def upload(client, data: bytes, content_type: str = "application/gzip"):
    return client.generic("POST", URL, data, content_type=content_type)


def test_an_upload_is_stored_under_its_digest_then_answered_200(as_user):
    data = tar_gz()
    digest = hashlib.sha256(data).hexdigest()
    first = upload(as_user("bob"), data)
    assert first.status_code == 201, first.content
    assert first.json()["sha256"] == digest and first.json()["size"] == len(data)
    assert set(first.json()) >= {"sha256", "size", "created_at"}
    bundle = Bundle.objects.get()
    assert digest in bundle.storage_name
    with default_storage.open(bundle.storage_name, "rb") as stored:
        assert stored.read() == data
    again = upload(as_user("alice"), data)  # the same tenant: nothing new
    assert again.status_code == 200 and again.json()["sha256"] == digest
    assert Bundle.objects.count() == 1
    assert len(os.listdir(default_storage.path(f"bundles/{bundle.tenant_id}"))) == 1


def test_an_upload_whose_row_lost_its_file_stores_the_file_again(as_user):
    data = tar_gz()
    assert upload(as_user("bob"), data).status_code == 201
    bundle = Bundle.objects.get()
    default_storage.delete(bundle.storage_name)
    assert upload(as_user("bob"), data).status_code == 200
    bundle.refresh_from_db()
    with default_storage.open(bundle.storage_name, "rb") as stored:
        assert stored.read() == data


def test_a_zip_is_a_bundle_too(as_user):
    response = upload(as_user("bob"), a_zip(), "application/zip")
    assert response.status_code == 201, response.content
    assert response.json()["content_type"] == "application/zip"


def test_head_says_whether_the_tenant_has_it_and_another_tenant_gets_404(as_user):
    data = tar_gz()
    digest = hashlib.sha256(data).hexdigest()
    assert as_user("bob").head(f"{URL}{digest}/").status_code == 404
    assert upload(as_user("bob"), data).status_code == 201
    assert as_user("bob").head(f"{URL}{digest}/").status_code == 200
    assert as_user("carol").head(f"{URL}{digest}/").status_code == 200  # a viewer reads
    assert as_user("dave").head(f"{URL}{digest}/").status_code == 404  # globex
    assert as_user("dave").get(f"{URL}{digest}/").status_code == 404
    assert as_user("dave").get(URL).json()["results"] == []
    mine = as_user("bob").get(f"{URL}{digest}/")
    assert mine.status_code == 200 and mine.json()["size"] == len(data)
    assert [b["sha256"] for b in as_user("carol").get(URL).json()["results"]] == [digest]
    assert as_user(None).head(f"{URL}{digest}/").status_code == 401


def test_the_same_bytes_from_another_tenant_are_its_own_bundle(as_user):
    data = tar_gz()
    assert upload(as_user("bob"), data).status_code == 201
    assert upload(as_user("dave"), data).status_code == 201
    names = set(Bundle.objects.values_list("storage_name", flat=True))
    assert len(names) == 2


def test_a_viewer_may_not_upload(as_user):
    response = upload(as_user("carol"), tar_gz())
    assert response.status_code == 403
    assert "viewer" in response.json()["detail"]
    assert not Bundle.objects.exists()


@pytest.mark.parametrize(
    "data,content_type,field",
    [
        (b"", "application/gzip", "body"),
        (b"plain text, not an archive", "application/gzip", "body"),
        (a_zip(), "application/gzip", "body"),
        (tar_gz(), "application/zip", "body"),
        (b"\x1f\x8b" + b"\x00" * 100, "application/gzip", "body"),  # gzip magic, broken stream
        (tar_gz(), "application/json", "Content-Type"),
        (tar_gz(), "application/octet-stream", "Content-Type"),
        (tar_gz(), "", "Content-Type"),
    ],
    ids=["empty", "text", "zip-as-gzip", "gzip-as-zip", "broken-gzip", "json", "octet", "none"],
)
def test_a_wrong_type_or_an_empty_body_is_400_naming_the_field(as_user, data, content_type, field):
    response = upload(as_user("bob"), data, content_type)
    assert response.status_code == 400, response.content
    assert field in response.json(), response.json()
    assert not Bundle.objects.exists()


def test_gzip_that_holds_no_tar_is_refused(as_user):
    import gzip

    response = upload(as_user("bob"), gzip.compress(os.urandom(4096)))
    assert response.status_code == 400
    assert "tar" in response.json()["body"][0]


def small_cap(mib: int = 1) -> None:
    Tenant.objects.filter(slug="acme").update(bundle_max_mib=mib)


def test_over_the_cap_by_content_length_is_413_naming_cap_and_size(as_user):
    small_cap(1)
    data = b"\x1f\x8b" + os.urandom(1024 * 1024 + 10)
    response = upload(as_user("bob"), data)
    assert response.status_code == 413
    message = response.json()["body"][0]
    assert "1 MiB" in message and str(len(data)) in message, message
    assert not Bundle.objects.exists()


def test_a_body_without_content_length_stops_at_the_cap(as_user, cast):
    """Counted as it arrives: a body whose declared length is absent (chunked) or wrong."""
    small_cap(1)
    tenant = Tenant.objects.get(slug="acme")
    body = io.BytesIO(tar_gz({"big.bin": os.urandom(2 * 1024 * 1024)}))
    with pytest.raises(services.BundleRefused) as refused:
        services.store(tenant=tenant, user=cast["bob"][0], source=body,
                       content_type="application/gzip", length=None)  # fmt: skip
    assert refused.value.status == 413
    assert "1 MiB" in refused.value.message and str(1024 * 1024) in refused.value.message
    assert body.tell() <= 2 * 1024 * 1024 + services.CHUNK  # it stopped reading at the cap
    assert not Bundle.objects.exists()


def test_the_tier_cap_applies_without_a_tenant_override(as_user):
    tenant = Tenant.objects.get(slug="acme")
    assert tenant.bundle_cap_bytes == tenant.tier.bundle_max_mib * 1024 * 1024 == 100 * 1024 * 1024
    tenant.tier.bundle_max_mib = 1
    tenant.tier.save()
    assert upload(as_user("bob"), b"\x1f\x8b" + bytes(2 * 1024 * 1024)).status_code == 413


def test_an_upload_is_streamed_not_held_in_memory(cast, tmp_path):
    """A ~20 MiB upload through the view, its body read from a file: the peak of Python's
    allocations stays far below the upload's size."""
    size = 20 * 1024 * 1024
    source = tmp_path / "upload.tar.gz"
    source.write_bytes(tar_gz({"weights.bin": os.urandom(size)}))
    length = source.stat().st_size
    view = BundleViewSet.as_view({"post": "create"})
    with open(source, "rb") as body:
        environ = RequestFactory()._base_environ(
            PATH_INFO=URL, REQUEST_METHOD="POST", CONTENT_TYPE="application/gzip",
            CONTENT_LENGTH=str(length), HTTP_AUTHORIZATION=f"Token {cast['bob'][1]}",
            **{"wsgi.input": body},
        )  # fmt: skip
        request = WSGIRequest(environ)
        tracemalloc.start()
        try:
            response = view(request)
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
    assert response.status_code == 201, response.data
    assert response.data["size"] == length
    print(f"peak {peak} bytes of Python allocations for a {length} byte upload")
    assert peak < 6 * 1024 * 1024, f"peak {peak} bytes for a {length} byte upload"


# --- delete and retention --------------------------------------------------------------------------


def a_bundle(as_user, user="bob", files=None) -> Bundle:
    response = upload(as_user(user), tar_gz(files))
    assert response.status_code == 201
    return Bundle.objects.get(
        sha256=response.json()["sha256"], tenant__memberships__user__username=user
    )


def job_using(bundle: Bundle, state: str) -> Job:
    from apps.tenants.models import Tier

    user = bundle.tenant.memberships.first().user
    return Job.objects.create(
        tenant=bundle.tenant, user=user, tier=Tier.objects.get(name="enterprise"), name="j",
        command=["python", "train.py"], bundle=bundle.sha256, state=state,
    )  # fmt: skip


def test_delete_refuses_while_a_live_job_uses_it(as_user):
    bundle = a_bundle(as_user)
    url = f"{URL}{bundle.sha256}/"
    job = job_using(bundle, "queued")
    assert as_user("carol").delete(url).status_code == 403
    assert as_user("dave").delete(url).status_code == 404
    assert as_user("bob").delete(url).status_code == 409
    Job.objects.filter(pk=job.pk).update(state="succeeded")
    assert as_user("bob").delete(url).status_code == 204
    assert not Bundle.objects.exists()
    assert not default_storage.exists(bundle.storage_name)


def test_retention_expires_only_old_unreferenced_bundles(as_user, settings):
    settings.BUNDLE_RETENTION_DAYS = 7
    old = timezone.now() - timedelta(days=8)
    unused_old = a_bundle(as_user, files={"a.py": b"a"})
    running_old = a_bundle(as_user, files={"b.py": b"b"})
    finished_old = a_bundle(as_user, files={"c.py": b"c"})
    recent = a_bundle(as_user, files={"d.py": b"d"})
    Bundle.objects.exclude(pk=recent.pk).update(last_used_at=old)
    job_using(running_old, "running")
    job_using(finished_old, "failed")
    # another tenant's live job naming the same digest keeps nothing of acme's alive
    other = a_bundle(as_user, user="dave", files={"a.py": b"a"})
    Bundle.objects.filter(pk=other.pk).update(last_used_at=old)
    job_using(other, "queued")
    out = io.StringIO()
    call_command("expire_bundles", stdout=out)
    left = set(Bundle.objects.values_list("pk", flat=True))
    assert left == {running_old.pk, recent.pk, other.pk}
    assert not default_storage.exists(unused_old.storage_name)
    assert not default_storage.exists(finished_old.storage_name)
    assert default_storage.exists(running_old.storage_name)
    assert "2" in out.getvalue()


def test_the_beat_runs_the_expiry(settings):
    from apps.platform.names import Task
    from apps.scheduling.schedule import beat_schedule

    entry = beat_schedule()["expire-bundles"]
    assert entry["task"] == Task.EXPIRE_BUNDLES
    from apps.bundles import tasks

    assert tasks.expire_bundles.name == Task.EXPIRE_BUNDLES


def test_head_and_get_keep_a_bundle_from_expiring(as_user, settings):
    bundle = a_bundle(as_user)
    Bundle.objects.update(last_used_at=timezone.now() - timedelta(days=30))
    assert as_user("bob").head(f"{URL}{bundle.sha256}/").status_code == 200
    assert services.expire() == []


# --- the agent API ---------------------------------------------------------------------------------


@pytest.fixture
def placed_with_bundle(as_user, cast):
    """A started job on h1 whose job names an uploaded bundle; clients for h1's and h2's agents."""
    from apps.nodes.credentials import issue_credential
    from tests.factories import make_node
    from tests.unit.test_agent_api import bearer
    from tests.unit.test_dispatcher import placed_and_started

    Job.objects.all().delete()
    from apps.nodes.models import Node

    Node.objects.all().delete()
    make_node("h1", gpus=1)
    make_node("h2", gpus=1)
    data = tar_gz({"train.py": b"print('from the bundle')\n"})
    digest = upload(as_user("bob"), data).json()["sha256"]
    job, attempt = placed_and_started(cast)
    Job.objects.filter(pk=job.pk).update(bundle=digest, command=["python", "train.py"])
    h1 = bearer(issue_credential(node_name="h1")[1])
    h2 = bearer(issue_credential(node_name="h2")[1])
    return attempt, data, h1, h2


def bundle_url(attempt) -> str:
    return f"/internal/agent/v1/members/{attempt.pk}/0/bundle/"


def test_the_agent_of_the_members_node_gets_the_bundle(placed_with_bundle):
    from tests.unit.test_agent_api import fenced

    attempt, data, h1, _ = placed_with_bundle
    response = h1.get(bundle_url(attempt), **fenced(attempt))
    assert response.status_code == 200
    assert b"".join(response.streaming_content) == data
    assert response["Content-Type"] == "application/gzip"
    assert response["Content-Length"] == str(len(data))
    assert response["X-Bundle-Sha256"] == hashlib.sha256(data).hexdigest()


def test_another_node_a_wrong_token_or_an_ended_attempt_get_404(placed_with_bundle):
    from apps.jobs import services as jobs
    from tests.unit.test_agent_api import fenced

    attempt, _, h1, h2 = placed_with_bundle
    assert h2.get(bundle_url(attempt), **fenced(attempt)).status_code == 404
    assert h1.get(bundle_url(attempt), **fenced(attempt, token="x")).status_code == 404
    assert h1.get(bundle_url(attempt)).status_code == 404
    assert (
        h1.get(f"/internal/agent/v1/members/{attempt.pk}/1/bundle/", **fenced(attempt)).status_code
        == 404
    )
    jobs.attempt_member_finished(attempt_id=attempt.pk, rank=0, token=str(attempt.token), exit_code=0,
                                 reason="", checkpoint="")  # fmt: skip
    assert h1.get(bundle_url(attempt), **fenced(attempt)).status_code == 404


def test_a_job_without_a_bundle_has_none_to_fetch(placed_with_bundle):
    from tests.unit.test_agent_api import fenced

    attempt, _, h1, _ = placed_with_bundle
    Job.objects.filter(pk=attempt.job_id).update(bundle="")
    assert h1.get(bundle_url(attempt), **fenced(attempt)).status_code == 404


def test_a_user_token_is_not_a_node_credential(placed_with_bundle, as_user):
    from tests.unit.test_agent_api import fenced

    attempt, _, _, _ = placed_with_bundle
    assert as_user("bob").get(bundle_url(attempt), **fenced(attempt)).status_code == 401
