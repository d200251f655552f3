"""Browser tests drive Debian's Chromium (`make browser` installs it; no browser download)
through Playwright against the real platform shared with the CLI tests.

Every page they open is watched for Content-Security-Policy violations (the page's
`securitypolicyviolation` events and Chromium's "Refused to ..." console errors): any one fails
the test that saw it, so the policy in gpuplatform/settings.py is one the pages work under."""

import os
import pathlib

import pytest

from tests.browser.ui_platform import stop_after_last_user, ui_platform
from tests.e2e.platform import ROOT

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run"]  # fmt: skip
SCREENSHOTS = pathlib.Path(
    os.environ.get("GPUPLATFORM_SCREENSHOTS", ROOT / "docs" / "screenshots" / "latest")
)
PASSWORD = "e2e-password"  # tests/e2e/seed.py


@pytest.fixture(scope="package")
def platform(tmp_path_factory, request):
    return ui_platform(tmp_path_factory, request)


# Reported to the test through a binding, so it survives every navigation of the context.
CSP_LISTENER = """
document.addEventListener("securitypolicyviolation", (e) => {
  window.__cspViolation(`${e.violatedDirective} blocked ${e.blockedURI || "inline"} at ${e.documentURI}`);
});
"""
CSP_VIOLATIONS: list[str] = []


class CspWatchingBrowser:
    """The browser, with every new context watched for CSP violations."""

    def __init__(self, browser):
        self._browser = browser

    def __getattr__(self, name):
        return getattr(self._browser, name)

    def new_context(self, **kwargs):
        context = self._browser.new_context(**kwargs)
        context.expose_binding("__cspViolation", lambda source, text: CSP_VIOLATIONS.append(text))
        context.add_init_script(CSP_LISTENER)
        context.on("page", _watch_console)
        return context


def _watch_console(page) -> None:
    def seen(message):
        if message.type == "error" and "Content Security Policy" in message.text:
            CSP_VIOLATIONS.append(f"console: {message.text}")

    page.on("console", seen)


@pytest.fixture(autouse=True)
def no_csp_violation():
    CSP_VIOLATIONS.clear()
    yield
    assert CSP_VIOLATIONS == [], "the pages broke their Content-Security-Policy:\n" + "\n".join(
        CSP_VIOLATIONS
    )


@pytest.fixture(scope="package")
def chromium():
    if not os.path.exists(CHROMIUM):
        pytest.skip(f"{CHROMIUM} missing: run `make browser` (apt-get install chromium)")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        yield CspWatchingBrowser(browser)
        browser.close()


@pytest.fixture
def sign_in(chromium, platform):
    """A fresh browser context signed in through the login form as `username`."""
    contexts = []

    def open_as(username: str, **context_args):
        context = chromium.new_context(base_url=platform.url, accept_downloads=True, **context_args)
        contexts.append(context)
        page = context.new_page()
        page.set_default_timeout(20_000)
        page.goto("/login/")
        page.fill("#id_username", username)
        page.fill("#id_password", PASSWORD)
        page.click("button[type=submit]")
        page.wait_for_url(platform.url + "/")
        return page

    yield open_as
    for context in contexts:
        context.close()


@pytest.fixture(scope="package")
def shoot():
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)

    def save(page, name: str, **kwargs) -> None:
        page.screenshot(path=str(SCREENSHOTS / f"{name}.png"), **kwargs)

    return save


def pytest_runtest_teardown(item, nextitem):
    stop_after_last_user(item, nextitem)
