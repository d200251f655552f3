"""Every page carries the Content-Security-Policy, and our templates need nothing it forbids:
no inline script, no style attribute or element, no event-handler attribute (checked here on the
HTML, so it holds where the browser tests cannot run; they check the pages in Chromium)."""

import re

import pytest
from django.test import Client

INLINE = re.compile(
    r"<script(?![^>]*\bsrc=)(?![^>]*application/json)|<style\b|\sstyle=|\son[a-z]+=", re.I
)


@pytest.mark.parametrize("path", ["/", "/jobs/", "/jobs/new/", "/usage/"])
def test_customer_pages_have_the_policy_and_no_inline_code(browser_as, path):
    response = browser_as("bob").get(path)
    assert response.status_code == 200
    policy = response["Content-Security-Policy"]
    assert (
        "default-src 'self'" in policy and "script-src 'self'" in policy and "unsafe" not in policy
    )
    assert INLINE.findall(response.content.decode()) == []


def test_the_login_page_too(db):
    response = Client().get("/login/")
    assert "unsafe" not in response["Content-Security-Policy"]
    assert INLINE.findall(response.content.decode()) == []


def test_drfs_browsable_api_alone_may_use_inline_style(browser_as):
    response = browser_as("bob").get("/api/v1/jobs/", HTTP_ACCEPT="text/html")
    policy = response["Content-Security-Policy"]
    assert "style-src 'self' 'unsafe-inline'" in policy and "script-src 'self';" in policy + ";"
    assert "unsafe" not in browser_as("bob").get("/api/v1/jobs/")["Content-Security-Policy"]


def test_the_middleware_stays_async_for_async_views():
    """Django runs an async view (the event streams under ASGI) on the loop only if every
    middleware is async-capable."""
    import asyncio

    from asgiref.sync import iscoroutinefunction
    from django.http import HttpResponse
    from django.test import RequestFactory

    from gpuplatform.csp import HEADER, ContentSecurityPolicyMiddleware

    async def view(request):
        return HttpResponse("ok", content_type="text/event-stream")

    middleware = ContentSecurityPolicyMiddleware(view)
    assert iscoroutinefunction(middleware)
    response = asyncio.run(middleware(RequestFactory().get("/api/v1/jobs/x/events/")))
    assert "default-src 'self'" in response[HEADER]
