"""The pages are served under a Content-Security-Policy with no inline script or style, and the
browser tests' watch (conftest.py) does see a violation when one happens."""

import pytest

from tests.browser import conftest

pytestmark = pytest.mark.e2e

INJECT_STYLE = """() => new Promise((resolve) => {
  document.addEventListener("securitypolicyviolation", (e) => resolve(e.violatedDirective), {once: true});
  document.head.insertAdjacentHTML("beforeend", "<style>body { color: red }</style>");
})"""


def test_the_login_page_has_a_strict_policy_and_a_violation_is_seen(chromium, platform):
    context = chromium.new_context(base_url=platform.url)
    page = context.new_page()
    response = page.goto("/login/")
    policy = response.headers["content-security-policy"]
    assert (
        "script-src 'self'" in policy
        and "style-src 'self'" in policy
        and "unsafe-inline" not in policy
    )
    # An inline style the policy forbids: refused, and reported to the watch.
    directive = page.evaluate(INJECT_STYLE)
    page.evaluate("1")  # one more round trip: the watch's binding call has arrived by then
    seen = list(conftest.CSP_VIOLATIONS)
    conftest.CSP_VIOLATIONS.clear()
    context.close()
    assert directive.startswith("style-src")
    assert any("style-src" in v for v in seen), seen
