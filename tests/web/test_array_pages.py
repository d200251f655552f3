"""Job arrays in the web UI (docs/arrays.md): one row in the jobs list that opens into the
array's page, its progress bar by state (SVG, no inline style: CSP), its tasks, cancel-all."""

from apps.admission import buckets  # noqa: F401 (the conftest's fixtures reset them)
from apps.jobs.models import Job
from apps.scheduling.dispatcher import dispatch_once
from apps.tenants.models import Tenant
from apps.tenants.services import quota_set

TRAIN = {"template": "demo-train", "params": {"steps": 2}, "gpus": 1, "gpu_sku": "H100-80GB"}


def test_an_array_is_one_row_that_opens_into_its_tasks(as_user, browser_as):
    quota_set(tenant=Tenant.objects.get(slug="acme"), max_queued_jobs=5000)
    array = as_user("bob").post("/api/v1/jobs/", {**TRAIN, "array": "0-99%4"}, format="json").json()
    single = as_user("bob").post("/api/v1/jobs/", TRAIN, format="json").json()
    dispatch_once()  # 4 placed (%4): the other 96 tasks have no row yet
    assert Job.objects.filter(array_id=array["id"]).count() == 4
    bob = browser_as("bob")
    page = bob.get("/jobs/").content.decode()
    assert page.count(f'data-array="{array["id"]}"') == 1 and page.count("data-job=") == 1
    assert f'data-job="{single["id"]}"' in page and f"/arrays/{array['id']}/" in page
    assert 'class="array-bar"' in page and "0/100" in page and " style=" not in page
    assert page.count('class="bar-') >= 2  # queued and starting segments
    assert bob.get("/").content.decode().count(f'data-array="{array["id"]}"') == 1
    detail = bob.get(f"/arrays/{array['id']}/")
    text = detail.content.decode()
    assert detail.status_code == 200 and 'class="array-bar"' in text and " style=" not in text
    assert text.count("<tr data-") == 50 and "page 1 of 2 (100 tasks)" in text
    assert "not yet a job" in text and 'data-job="' in text  # virtual tasks beside rows
    starting = bob.get(f"/arrays/{array['id']}/?state=starting").content.decode()
    assert starting.count("<tr data-job=") == 4
    assert browser_as("dave").get(f"/arrays/{array['id']}/").status_code == 404
    assert browser_as("carol").post(f"/arrays/{array['id']}/cancel/").status_code == 403
    assert bob.post(f"/arrays/{array['id']}/cancel/").status_code == 302
    assert not Job.objects.filter(array_id=array["id"]).exclude(state="cancelled").exists()
    assert "cancelled 100" in " ".join(
        bob.get(f"/arrays/{array['id']}/").content.decode().split()
    ).replace(
        '<span class="state state-cancelled" data-state="cancelled">cancelled</span>', "cancelled"
    )
