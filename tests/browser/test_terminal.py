"""The job page's terminal (docs/interactive.md): an interactive job's shell in the browser,
through the same relay as `gpuplatform shell`, signed in with the page's session."""

import pathlib

import pytest

pytestmark = pytest.mark.e2e
XTERM = (
    pathlib.Path(__file__).resolve().parents[2]
    / "node_modules"
    / "@xterm"
    / "xterm"
    / "lib"
    / "xterm.js"
)


def test_an_interactive_job_page_opens_a_shell_in_the_page(sign_in, platform):
    if not XTERM.exists():
        pytest.skip("xterm.js is not installed (make install runs npm ci)")
    nodes = platform.nodes()
    if any(node["isolation"] == "none" for node in nodes.values()):
        pytest.skip("the agents cannot fence jobs here: sessions need root and cgroups")
    job = platform.submit("alice", interactive=True, gpus=1)
    platform.wait_for_state(job["id"], "running", timeout=120)
    page = sign_in("alice")
    page.goto(f"/jobs/{job['id']}/")
    assert f"gpuplatform port-forward {job['id']} 8888" in page.inner_text("#sessions")
    page.click("#terminal-link")
    page.click("#terminal-open")
    page.wait_for_selector("#terminal-status:has-text('connected')", timeout=60_000)
    page.wait_for_selector("#terminal .xterm-rows:has-text('$')", timeout=60_000)
    page.click("#terminal")
    page.keyboard.type("echo UP$((40+2))\n")
    page.wait_for_selector("#terminal .xterm-rows:has-text('UP42')", timeout=30_000)
    page.keyboard.type("exit 4\n")
    page.wait_for_selector("#terminal-status:has-text('the shell exited 4')", timeout=30_000)
    assert platform.wait_for_state(job["id"], ("failed", "succeeded"), timeout=60)["exit_code"] == 4
