"""A gang's job page in a real browser: a tab per member, each showing that member's own log
(loaded from the API as text, under the page's Content-Security-Policy)."""

import pytest

pytestmark = pytest.mark.e2e

HELLO = "import os, time; print('<b>hello</b> from rank', os.environ['RANK'], flush=True); time.sleep(60)"


def test_a_gangs_page_shows_each_members_log_in_its_tab(sign_in, platform, shoot):
    job = platform.submit("bob", command=["python", "-c", HELLO], gpu_sku="A100-40GB", gpus=1,
                          nodes=2, name="two-members")  # fmt: skip
    try:
        platform.wait_for_state(job["id"], "running", timeout=60)
        page = sign_in("bob")
        page.goto(f"/jobs/{job['id']}/")
        tabs = page.locator("#member-logs button.member-tab")
        assert tabs.count() == 2
        assert tabs.nth(1).inner_text().startswith("rank 1 · ui-a")
        for rank in (1, 0):
            expected = f"<b>hello</b> from rank {rank}"  # text, never markup
            deadline_ms = 30_000
            tabs.nth(rank).click()
            page.wait_for_function(
                "expected => document.querySelector('#member-log').textContent.includes(expected)",
                arg=expected, timeout=deadline_ms,
            )  # fmt: skip
            if rank == 1:
                assert page.locator("#member-log b").count() == 0
                shoot(page, "member-logs", full_page=True)
            assert f"from rank {1 - rank}" not in page.inner_text("#member-log")
    finally:
        platform.post("bob", f"/api/v1/jobs/{job['id']}/cancel/")
