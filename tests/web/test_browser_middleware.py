"""The browser's middleware (sessions, authentication, OTP, messages, htmx) steps aside for the
agent API (gpuplatform/browser_middleware.py); the security headers are still on its answers,
and a browser's page still gets all of it."""

import pytest
from django.contrib.auth.middleware import AuthenticationMiddleware
from django.contrib.messages.middleware import MessageMiddleware
from django.contrib.sessions.middleware import SessionMiddleware
from django.test import Client
from django_htmx.middleware import HtmxMiddleware
from django_otp.middleware import OTPMiddleware

from apps.nodes.credentials import issue_credential
from tests.unit.test_agent_api import bearer


@pytest.fixture
def ran(monkeypatch) -> list[str]:
    """The browser middleware that ran, by class, in order."""
    ran: list[str] = []
    for cls in (SessionMiddleware, AuthenticationMiddleware, MessageMiddleware):
        original = cls.process_request

        def process_request(self, request, original=original, name=cls.__name__):
            ran.append(name)
            return original(self, request)

        monkeypatch.setattr(cls, "process_request", process_request)
    for cls in (OTPMiddleware, HtmxMiddleware):
        original = cls.__call__

        def call(self, request, original=original, name=cls.__name__):
            ran.append(name)
            return original(self, request)

        monkeypatch.setattr(cls, "__call__", call)
    return ran


BROWSER = ["SessionMiddleware", "AuthenticationMiddleware", "OTPMiddleware", "MessageMiddleware",
           "HtmxMiddleware"]  # fmt: skip


def test_an_agent_request_runs_none_of_the_browsers_middleware_and_keeps_the_headers(db, ran):
    agent = bearer(issue_credential(node_name="n1")[1])
    response = agent.post("/internal/agent/v1/reports/", {"reports": []}, format="json")
    assert response.status_code == 400  # it reached the view, authenticated by its credential
    assert ran == ["SessionMiddleware"]  # kept by name for check --deploy; its session never read
    assert response["X-Content-Type-Options"] == "nosniff"
    assert response["X-Frame-Options"] == "DENY"
    assert "Content-Security-Policy" in response
    assert "Set-Cookie" not in response


def test_a_browsers_request_still_runs_all_of_it(db, ran):
    from django.conf import settings
    from django.shortcuts import resolve_url

    assert Client().get(resolve_url(settings.LOGIN_URL)).status_code == 200
    assert ran == BROWSER


def test_an_api_request_skips_the_message_store_and_keeps_the_rest(browser_as, ran):
    """The API adds and shows no flash message: its requests set up no store, a signed-in
    browser's included; the session, authentication, OTP and htmx still run for them."""
    response = browser_as("bob").get("/api/v1/jobs/")
    assert response.status_code == 200  # the session's user, through all the rest
    assert ran == [name for name in BROWSER if name != "MessageMiddleware"]
