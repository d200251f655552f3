"""The web's access log, started as the Procfile starts it (`--access-logfile -`): people's
requests are logged, the agents' heartbeats and reports are not (they were nine lines in ten of
`make run`'s output); GPUPLATFORM_AGENT_ACCESS_LOG=1 brings them back."""

import logging
import time

import pytest

from gpuplatform.web_worker import QuietAgentAccess, quiet_agent_access

pytestmark = pytest.mark.e2e


def test_the_web_logs_api_requests_and_not_the_agents_calls(platform):
    platform.get("bob", "/api/v1/jobs/")
    platform.wait_until(
        lambda: "GET /api/v1/jobs/" in platform.logs("web"), timeout=30, what="the access line"
    )
    log = platform.logs("web", tail=200_000)
    assert "/internal/agent/" not in log  # every node registered and heartbeats: none logged


def _access_record(path: str, status: int) -> logging.LogRecord:
    return logging.LogRecord(
        "uvicorn.access", logging.INFO, __file__, 1, '%s - "%s %s HTTP/%s" %d',
        ("127.0.0.1:5000", "POST", path, "1.1", status), None,
    )  # fmt: skip


def test_a_failed_agent_call_is_still_logged():
    quiet = QuietAgentAccess()
    assert not quiet.filter(_access_record("/internal/agent/v1/heartbeat/", 200))
    assert quiet.filter(_access_record("/internal/agent/v1/heartbeat/", 403))
    assert quiet.filter(_access_record("/api/v1/jobs/", 201))


def test_the_setting_brings_the_agents_lines_back(monkeypatch):
    monkeypatch.setenv("GPUPLATFORM_AGENT_ACCESS_LOG", "1")
    logger = logging.getLogger("test-access-log-setting")
    quiet_agent_access(logger)
    assert logger.filters == []


def test_the_dispatchers_ticks_are_not_logged_at_info(platform):
    """The dispatcher runs with `--loglevel INFO` as in the Procfile: its beat's ticks (dispatch,
    reconcile, autoscale every few seconds) once made three lines each."""
    platform.wait_until(
        lambda: "ready." in platform.logs("dispatcher", tail=10**6),
        timeout=60,
        what="the dispatcher up",
    )
    time.sleep(6)  # several dispatch and reconcile ticks
    log = platform.logs("dispatcher", tail=200_000)
    assert "Sending due task" not in log
    assert "scheduling.reconcile[" not in log and "scheduling.dispatch[" not in log
