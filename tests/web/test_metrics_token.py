"""GPUPLATFORM_METRICS_TOKEN: when set, `/metrics` wants `Authorization: Bearer <it>` (401
otherwise); unset, it is open as before."""

import pytest
from django.test import Client

TOKEN = "scrape-me-0123456789"


@pytest.fixture
def metrics_token(settings):
    settings.METRICS_TOKEN = TOKEN


def test_open_when_no_token_is_set(db):
    assert Client().get("/metrics").status_code == 200


@pytest.mark.parametrize(
    "header",
    [None, "", f"Token {TOKEN}", "Bearer", "Bearer wrong", f"Bearer {TOKEN}x", f"Basic {TOKEN}"],
)
def test_without_the_token_401(db, metrics_token, header):
    extra = {} if header is None else {"HTTP_AUTHORIZATION": header}
    response = Client().get("/metrics", **extra)
    assert response.status_code == 401
    assert response["WWW-Authenticate"].startswith("Bearer")
    assert b"gpuplatform_" not in response.content


def test_with_the_token_the_figures(db, metrics_token):
    response = Client().get("/metrics", HTTP_AUTHORIZATION=f"Bearer {TOKEN}")
    assert response.status_code == 200 and b"gpuplatform_jobs" in response.content
    assert Client().get("/metrics", HTTP_AUTHORIZATION=f"bearer {TOKEN}").status_code == 200
