"""The node agent running in this process, if any (set by `python -m workers.agent`)."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from workers.agent import Agent

AGENT: Agent | None = None
