"""The customer pages and the admin in a real browser: sign in, submit demo-train through the
form, watch it reach succeeded with its progress moving (htmx, no reload), download its result;
another tenant gets 404; staff drain a node in the admin and no new placement lands on it."""

import json
import time

import pytest

pytestmark = pytest.mark.e2e


def test_a_customer_submits_watches_and_downloads_a_demo_train_job(sign_in, platform, shoot):
    page = sign_in("bob")
    assert "acme" in page.inner_text("main")
    page.click("text=Submit")
    page.select_option("#id_template_pick", "demo-train")  # htmx swaps in its parameter fields
    page.wait_for_selector("input[name=param_step_seconds]")
    page.fill("input[name=param_steps]", "12")
    page.fill("input[name=param_step_seconds]", "0.5")
    page.fill("#id_name", "browser-run")
    page.select_option("#id_gpu_sku", "H100-80GB")
    assert "free now" in page.inner_text("#id_gpu_sku")
    shoot(page, "submit")
    page.click("text=Submit job")
    page.wait_for_url("**/jobs/*/")
    job_id = page.url.rstrip("/").rsplit("/", 1)[-1]

    seen, shot = [], False
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        state = page.get_attribute("#job-live", "data-state")
        seen.append(float(page.get_attribute("#job-progress", "value")))
        if state == "running" and 0.3 < seen[-1] < 0.9 and not shot:
            shoot(page, "job-running")
            shot = True
        if state in ("succeeded", "failed", "cancelled"):
            break
        time.sleep(0.25)
    assert state == "succeeded", f"ended {state}"
    moving = sorted({p for p in seen if 0 < p < 1})
    assert len(moving) >= 3, f"progress did not move on the page: {seen}"
    assert seen == sorted(seen) and seen[-1] == 1.0
    assert "demo-train: done" in page.inner_text("#log")
    assert [e.inner_text() for e in page.query_selector_all("ol.timeline .state")] == [
        "queued", "starting", "running", "succeeded"]  # fmt: skip
    shoot(page, "job-succeeded", full_page=True)

    with page.expect_download() as download:
        page.click("#artifacts a:has-text('result.json')")
    result = json.loads(open(download.value.path()).read())
    assert result["steps"] == 12

    page.goto("/jobs/?state=succeeded")
    assert "browser-run" in page.inner_text("#jobs-live")
    shoot(page, "jobs")
    page.goto("/usage/")
    shoot(page, "usage")
    page.goto("/")
    shoot(page, "dashboard")
    platform.browser_job_id = job_id


def test_the_pages_read_on_a_phone(sign_in, shoot):
    page = sign_in(
        "bob", viewport={"width": 390, "height": 844}, device_scale_factor=1, is_mobile=True
    )
    page.goto("/jobs/")
    width = page.evaluate("document.documentElement.scrollWidth")
    assert width <= 400, f"the jobs page scrolls sideways on a phone ({width}px)"
    page.goto("/jobs/new/")
    shoot(page, "phone-submit")


def test_another_tenant_gets_404_on_the_job_page(sign_in, platform):
    job = platform.submit("bob", template="demo-train", params={"steps": 1}, gpus=1)
    page = sign_in("dave")
    response = page.goto(f"/jobs/{job['id']}/")
    assert response.status == 404
    response = page.goto(f"/api/v1/jobs/{job['id']}/artifacts/")
    assert response.status == 404


def test_anonymous_visitors_go_to_sign_in(chromium, platform):
    context = chromium.new_context(base_url=platform.url)
    page = context.new_page()
    for path in ["/", "/jobs/", "/jobs/new/", "/usage/"]:
        page.goto(path)
        assert page.url.startswith(platform.url + "/login/"), path
    context.close()


def _admin_node_action(page, node: str, action: str) -> None:
    page.goto("/admin/nodes/node/")
    row = page.locator("#result_list tr", has_text=node)
    row.locator("input.action-select").check()
    page.select_option("select[name=action]", action)
    page.click("button[name=index]")
    page.wait_for_selector("ul.messagelist")


def test_staff_drain_a_node_in_the_admin_and_no_new_placement_lands_on_it(sign_in, platform, shoot):
    page = sign_in("staff")
    _admin_node_action(page, "ui-a2", "make_draining")
    shoot(page, "admin-nodes")
    assert platform.nodes()["ui-a2"]["state"] == "draining"
    try:
        # Three A100 jobs of 2 GPUs: with ui-a2 draining they can only run one after another on ui-a1.
        ids = [platform.submit("bob", template="demo-train", params={"steps": 2, "step_seconds": 0.1}, gpus=2,
                               gpu_sku="A100-40GB")["id"] for _ in range(3)]  # fmt: skip
        jobs = [platform.wait_for_state(i, "succeeded", timeout=120) for i in ids]
        nodes = {p["node"] for job in jobs for a in job["attempts"] for p in a["placements"]}
        assert nodes == {"ui-a1"}
    finally:
        _admin_node_action(page, "ui-a2", "make_ready")
    assert platform.nodes()["ui-a2"]["state"] == "ready"
