"""Helpers for tests and benches that drive a `workers.runner.Runner` directly (no agent)."""

from __future__ import annotations

import time

from workers.runner import Runner


def stop_runner(runner: Runner, reason: str = "test over", *, timeout: float = 5.0) -> None:
    """Kill every job the runner holds and tick it until they are reaped (at most `timeout` s),
    as an agent does when it stops."""
    runner.kill_all(reason)
    deadline = time.monotonic() + timeout
    while (runner.runs or runner.reaping) and time.monotonic() < deadline:
        runner.tick()
        time.sleep(0.05)
