"""Production settings: with DEBUG=0 and GPUPLATFORM_HTTPS=1, `manage.py check --deploy` is
clean (secure cookies, HSTS, SSL redirect, a long SECRET_KEY, hosts from the environment), and
behind a TLS-terminating proxy too; without the switch the defaults are as for `make run`."""

import os
import secrets
import subprocess
import sys

import pytest

PRODUCTION = {
    "DEBUG": "0",
    "GPUPLATFORM_HTTPS": "1",
    "SECRET_KEY": secrets.token_urlsafe(50),
    "ALLOWED_HOSTS": "gpu.example.com",
}


def manage(*args: str, env: dict) -> subprocess.CompletedProcess:
    base = {
        k: v
        for k, v in os.environ.items()
        if k not in ("SECRET_KEY", "DEBUG", "DATABASE_URL", "ALLOWED_HOSTS")
    }
    return subprocess.run(
        [sys.executable, "manage.py", *args],
        env={**base, **env},
        capture_output=True,
        text=True,
        timeout=300,
    )


def setting(name: str, env: dict) -> str:
    code = f"from django.conf import settings; print(repr(getattr(settings, {name!r}, None)))"
    return manage("shell", "-c", code, env=env).stdout.strip().splitlines()[-1]


def issues(result: subprocess.CompletedProcess) -> list[str]:
    """The check's findings, drf-spectacular's (W001/W002: a field or view the API document
    cannot describe) included."""
    return [
        line
        for line in (result.stdout + result.stderr).splitlines()
        if line.startswith("?:") or ": (" in line
    ]


@pytest.mark.parametrize(
    "proxy", [{}, {"GPUPLATFORM_TRUSTED_PROXIES": "10.0.0.2"}, {"GPUPLATFORM_BEHIND_PROXY": "1"}]
)
def test_check_deploy_is_clean_in_production(proxy):
    result = manage("check", "--deploy", "--fail-level", "WARNING", env={**PRODUCTION, **proxy})
    assert result.returncode == 0, result.stderr
    assert issues(result) == [], result.stdout + result.stderr


def test_without_the_switch_check_deploy_names_what_is_missing():
    result = manage("check", "--deploy", env={**PRODUCTION, "GPUPLATFORM_HTTPS": "0"})
    found = " ".join(issues(result))
    for check in ("security.W004", "security.W008", "security.W012", "security.W016"):
        assert check in found


def test_the_proxy_header_is_trusted_only_behind_a_proxy():
    assert setting("SECURE_PROXY_SSL_HEADER", PRODUCTION) == "None"
    behind = {**PRODUCTION, "GPUPLATFORM_TRUSTED_PROXIES": "10.0.0.2"}
    assert setting("SECURE_PROXY_SSL_HEADER", behind) == "('HTTP_X_FORWARDED_PROTO', 'https')"
    assert setting("SECURE_HSTS_SECONDS", PRODUCTION) == str(365 * 24 * 3600)


def test_a_short_secret_key_is_refused_over_https():
    result = manage("check", env={**PRODUCTION, "SECRET_KEY": "short-key"})
    assert result.returncode != 0
    assert (
        "ImproperlyConfigured" in result.stderr
        and "SECRET_KEY must be at least 50" in result.stderr
    )


def test_hsts_below_an_hour_is_refused():
    result = manage("check", env={**PRODUCTION, "GPUPLATFORM_HSTS_SECONDS": "60"})
    assert result.returncode != 0 and "GPUPLATFORM_HSTS_SECONDS" in result.stderr
