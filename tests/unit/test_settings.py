"""Settings come from the environment, and bad values stop the process with a clear error."""

import os
import subprocess
import sys

import pytest

from gpuplatform import embedded_redis


def check(env: dict) -> subprocess.CompletedProcess:
    base = {k: v for k, v in os.environ.items() if k not in ("SECRET_KEY", "DEBUG", "DATABASE_URL")}
    return subprocess.run(
        [sys.executable, "manage.py", "check"], env={**base, **env}, capture_output=True, text=True
    )


@pytest.mark.parametrize(
    "env,message",
    [
        ({}, "SECRET_KEY is required"),
        ({"SECRET_KEY": "x", "DATABASE_URL": "foo://bar"}, "DATABASE_URL"),
        ({"SECRET_KEY": "x", "REDIS_URL": "http://nope"}, "REDIS_URL"),
        (
            {"SECRET_KEY": "x", "GPUPLATFORM_AGENT_REDIS_URL": "http://nope"},
            "GPUPLATFORM_AGENT_REDIS_URL",
        ),
        (
            {"SECRET_KEY": "x", "GPUPLATFORM_HEARTBEAT_SECONDS": "fast"},
            "GPUPLATFORM_HEARTBEAT_SECONDS",
        ),
        ({"SECRET_KEY": "x", "PORT": "99999"}, "PORT"),
        ({"SECRET_KEY": "x", "DEBUG": "maybe"}, "DEBUG"),
    ],
)
def test_a_bad_setting_stops_with_a_clear_error(env, message):
    result = check(env)
    assert result.returncode != 0
    assert "ImproperlyConfigured" in result.stderr and message in result.stderr


def test_debug_alone_needs_no_secret():
    assert check({"DEBUG": "1"}).returncode == 0


def test_the_embedded_redis_starts_answers_and_stops(tmp_path):
    server = embedded_redis.start(tmp_path / "redis")
    try:
        assert embedded_redis.ping(server.port)
        assert embedded_redis.discover_url(tmp_path / "redis") == server.url
    finally:
        server.stop()
    assert not embedded_redis.ping(server.port)
    assert embedded_redis.discover_url(tmp_path / "redis") is None


def test_an_operators_prepare_threshold_in_the_database_url_is_kept(monkeypatch):
    from gpuplatform import settings

    monkeypatch.setenv("DATABASE_URL", "postgres://u@db.example:5432/d")
    assert settings._database()["OPTIONS"]["prepare_threshold"] == 5  # ours, by default
    monkeypatch.setenv("DATABASE_URL", "postgres://u@db.example:5432/d?prepare_threshold=20")
    assert settings._database()["OPTIONS"]["prepare_threshold"] == 20
