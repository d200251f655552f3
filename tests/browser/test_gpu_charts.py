"""The job page's GPU charts in a real browser (docs/telemetry.md): an SVG chart per GPU with
both axes, their units and time labels, drawn under the Content-Security-Policy (the package's
watch fails the test on any violation), and live: new samples from the job's event stream are
drawn without a reload. The usage page's GPU hours allocated beside used."""

import time

import pytest

pytestmark = pytest.mark.e2e
BUSY = ["python3", "-c", "import time; t = time.time() + 60; exec('while time.time() < t: pass')"]


def util_points(page) -> int:
    return len(page.get_attribute("#gpu-charts polyline.line-util", "points").split())


def test_the_job_page_charts_each_gpu_live_with_axes_and_no_csp_violation(sign_in, platform, shoot):
    job = platform.submit("bob", command=BUSY, gpus=2, gpu_sku="H100-80GB")["id"]
    platform.wait_for_state(job, "running")
    page = sign_in("bob")
    page.goto(f"/jobs/{job}/")
    page.wait_for_selector("#gpu-charts figure.gpu-chart svg polyline.line-util", timeout=60_000)
    figures = page.query_selector_all("#gpu-charts figure.gpu-chart")
    assert len(figures) == 2
    text = page.text_content("#gpu-charts svg")
    assert "100%" in text and "0%" in text and "MiB" in text
    assert len(page.query_selector_all("#gpu-charts .ticks-x text")) == 6  # 3 time labels each
    before = util_points(page)
    deadline = time.monotonic() + 30
    while util_points(page) <= before + 2 and time.monotonic() < deadline:
        time.sleep(0.5)
    assert util_points(page) > before + 2, "the chart did not grow without a reload"
    shoot(page.locator("#gpu-charts"), "gpu-charts")
    platform.post("bob", f"/api/v1/jobs/{job}/cancel/")
    platform.wait_for_state(job, "cancelled")

    # The usage page: GPU hours allocated beside used, per day, with a y-axis in GPU-hours.
    page.goto("/usage/")
    assert len(page.query_selector_all("#gpu-efficiency rect.bar-used")) == 14
    assert "GPU-hours" in page.text_content("#gpu-efficiency svg")
    assert "bob" in page.inner_text("#gpu-efficiency table")
    shoot(page.locator("#gpu-efficiency"), "gpu-efficiency")
