"""Issue 31's page fixes in a real browser: the log box follows a job's newest lines across the
page's live updates (and stops when the reader scrolls up); the jobs table fits a phone's width;
the array page, the job page's chart and the usage chart, shot for docs/screenshots."""

import re
import time

import pytest

pytestmark = pytest.mark.e2e

LOG_AT_END = """() => { const el = document.querySelector('#log');
  return el.scrollHeight - el.scrollTop - el.clientHeight; }"""
LAST_STEP_SHOWN = """() => { const el = document.querySelector('#log');
  el.scrollIntoView({block: 'center'});
  const box = el.getBoundingClientRect();
  // the text at the box's bottom line, as the reader sees it
  const range = document.caretRangeFromPoint(box.left + 16, box.bottom - 22);
  if (!range) return '';
  const text = range.startContainer.textContent;
  const end = text.indexOf('\\n', range.startOffset);
  const start = text.lastIndexOf('\\n', range.startOffset - 1) + 1;
  return text.slice(start, end < 0 ? undefined : end); }"""


def _wait(condition, *, timeout: float, what: str) -> None:
    """Poll from here: page.wait_for_function evaluates a string, which the pages' CSP refuses."""
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.2)


def _newest_step(page) -> int:
    steps = re.findall(r"step (\d+)/", page.inner_text("#log"))
    return int(steps[-1]) if steps else 0


SCROLL_TO_END_BEFORE_SETTLE = """() => {
  htmx.config.defaultSettleDelay = 0;
  document.addEventListener("htmx:afterSwap", function once(event) {
    const el = event.target.querySelector && event.target.querySelector("#log");
    if (!el) return;
    document.removeEventListener("htmx:afterSwap", once);
    el.scrollTop = el.scrollHeight;
    window.scrolledBeforeSettle = true;
  });
}"""


def test_the_log_box_follows_the_newest_lines(sign_in, platform, shoot):
    job = platform.submit("bob", name="many-lines", template="demo-train", gpus=1,
                          params={"steps": 600, "step_seconds": 0.05})  # fmt: skip
    page = sign_in("bob")
    page.goto(f"/jobs/{job['id']}/")
    try:
        _wait(lambda: _newest_step(page) >= 40, timeout=60, what="step 40 in the log")
        time.sleep(6)  # six seconds of live updates, as in the issue
        assert page.evaluate(LOG_AT_END) < 24, "the log box is not at its newest lines"
        newest, shown = _newest_step(page), page.evaluate(LAST_STEP_SHOWN)
        seen = int(re.search(r"step (\d+)/", shown).group(1)) if "step " in shown else -1
        assert seen >= newest - 2, f"the box shows {shown!r}, the log is at step {newest}"
        assert newest > 60
        shoot(page, "job-log")
        # A reader who scrolls up keeps their place over the next updates.
        page.evaluate("document.querySelector('#log').scrollTop = 0")
        before = _newest_step(page)
        _wait(lambda: _newest_step(page) > before + 20, timeout=30, what="20 more steps")
        assert page.evaluate("document.querySelector('#log').scrollTop") < 50
        # And scrolling back to the end follows again, even when the scroll lands on a box just
        # swapped in, before htmx settles it (the load handler once put back the position noted
        # before the swap; under load a reader's scroll fell in that window and stopped the box
        # following). A settle delay of 0 runs the settle in the same task as the swap, so the
        # scroll below is certain to fall between them.
        page.evaluate(SCROLL_TO_END_BEFORE_SETTLE)
        _wait(lambda: page.evaluate("window.scrolledBeforeSettle === true"), timeout=10,
              what="a scroll between a swap and its settle")  # fmt: skip
        time.sleep(2.5)
        assert page.evaluate(LOG_AT_END) < 24
    finally:
        platform.post("bob", f"/api/v1/jobs/{job['id']}/cancel/")
    platform.wait_for_state(job["id"], "cancelled", timeout=60)


def _fits(page) -> list[str]:
    """What overflows sideways: the page itself, or a scrolling box inside it."""
    return page.evaluate("""() => {
      const wide = [];
      const root = document.documentElement;
      if (root.scrollWidth > root.clientWidth) wide.push(`page ${root.scrollWidth}px`);
      document.querySelectorAll('.scroll').forEach((el) => {
        if (el.scrollWidth > el.clientWidth + 1) wide.push(`table ${el.scrollWidth}px in ${el.clientWidth}px`);
      });
      return wide; }""")


def test_the_jobs_table_fits_a_phone(sign_in, platform, shoot):
    # A finished job, a running one and an array in the table.
    done = platform.submit("bob", name="phone-finished-run-with-a-long-name", template="demo-train",
                           gpus=1, params={"steps": 2, "step_seconds": 0.1})  # fmt: skip
    platform.submit("bob", name="phone-array", template="demo-train", gpus=1, array="0-3",
                    params={"steps": 2, "step_seconds": 0.1})  # fmt: skip
    platform.wait_for_state(done["id"], "succeeded", timeout=90)
    page = sign_in(
        "bob", viewport={"width": 390, "height": 844}, device_scale_factor=1, is_mobile=True
    )
    for path in ("/jobs/", "/"):
        page.goto(path)
        page.wait_for_selector("#jobs-live tbody tr")
        widths = page.evaluate(
            "() => [...document.querySelectorAll('#jobs-live th')].map((th) => th.innerText + ' ' + th.offsetWidth)"
        )
        assert _fits(page) == [], f"{path} does not fit a phone: columns {widths}"
    page.goto("/jobs/")
    shoot(page, "phone-jobs")


def test_the_array_job_and_usage_pages_for_the_docs(sign_in, platform, shoot):
    body = {"template": "demo-train", "gpus": 1, "params": {"steps": 3, "step_seconds": 0.2}}
    made = platform.submit("bob", name="sweep", array="0-7%4",
                           array_params=[{"fail_at_step": 1}] + [{}] * 7, **body)  # fmt: skip
    page = sign_in("bob", viewport={"width": 1100, "height": 900})
    page.goto(f"/arrays/{made['id']}/")
    _wait(lambda: page.get_attribute("#array-live", "hx-get") is None, timeout=120,
          what="the array to end")  # fmt: skip
    assert page.inner_text(".breadcrumb").startswith("Jobs")
    assert "exit code 3" in page.inner_text("table.tasks")
    shoot(page, "array", full_page=True)
    page.goto("/jobs/")
    assert _fits(page) == [], "the jobs table scrolls sideways on a laptop's screen"
    shoot(page, "jobs-list")
    page.goto("/usage/")
    page.wait_for_selector("#usage-chart")
    shoot(page, "usage-chart", full_page=True)
    page.goto("/jobs/new/")
    shoot(page, "submit-form", full_page=True)
