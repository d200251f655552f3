"""When a byte last passed through any session of an attempt, on any of its ranks (docs/
interactive.md): the relay marks it, and the agent of an interactive gang's rank 0, which ends
the job when it is idle, asks for it first, so a user typing on another rank's node keeps the
whole job alive. Losing Redis loses only this hint (the agent then waits and asks again)."""

from __future__ import annotations

import time
from typing import cast

from apps.platform.redis import shared_client

PREFIX = "gpuplatform:session-activity:"
MARK_EVERY = 1.0  # seconds: a busy session writes its attempt's key at most once a second
KEEP_SECONDS = 7 * 24 * 3600  # longer than an idle timeout is sensibly set


def key(attempt_id: int) -> str:
    return f"{PREFIX}{attempt_id}"


def quiet_for(attempt_id: int) -> float | None:
    """Seconds since a session of the attempt carried a byte (wall clock of the web processes);
    None if none has."""
    raw = cast(bytes | None, shared_client().get(key(attempt_id)))
    return None if raw is None else max(0.0, time.time() - float(raw))
