"""The words of honest waiting (API.md "Honest waiting"), pure (no Django: the job page, the
API's serializer, the event stream and the dispatcher all use it): times as ISO 8601 with the relative time
beside them, added when a job is read (the stored reason holds only the absolute time, so it
does not change, and is not written again, as the clock moves).

`relative(at, now)` -> "in ~12 min"; `with_relative(text, now)` adds it after every ISO time in
a reason; `window_words(start, earliest, latest, now)` -> "in ~12 min, likely 8-20 min".
"""

from __future__ import annotations

import re
from datetime import UTC, datetime


def _now() -> datetime:
    return datetime.now(UTC)


# "2026-12-06T17:11Z" or "2026-12-06T17:11:05Z" (what reasons write), not already followed by a
# relative time in brackets.
ISO_TIME = re.compile(r"(\d{4}-\d\d-\d\dT\d\d:\d\d(?::\d\d)?Z)(?! \((?:in ~|now|~))")


def iso(moment: datetime) -> str:
    """A time as reasons write it: ISO 8601 UTC to the second."""
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def iso_minute(moment: datetime) -> str:
    """To the minute: for reasons that must not change from one pass to the next."""
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%MZ")


def _span(seconds: float) -> tuple[float, str]:
    if seconds < 90:
        return max(seconds, 0), "s"
    if seconds < 90 * 60:
        return seconds / 60, "min"
    if seconds < 48 * 3600:
        return seconds / 3600, "h"
    return seconds / 86400, "d"


def relative(at: datetime, now: datetime | None = None) -> str:
    now = now or _now()
    seconds = (at - now).total_seconds()
    if abs(seconds) < 5:
        return "now"
    value, unit = _span(abs(seconds))
    figure = f"~{value:.0f} {unit}"
    return f"in {figure}" if seconds > 0 else f"{figure} ago"


def _parse(text: str) -> datetime | None:
    for fmt in ("%Y-%m-%dT%H:%M:%SZ", "%Y-%m-%dT%H:%MZ"):
        try:
            return datetime.strptime(text, fmt).replace(tzinfo=UTC)
        except ValueError:
            continue
    return None


def with_relative(text: str, now: datetime | None = None) -> str:
    """Each ISO time of `text` followed by its relative time: "... from 2026-12-06T17:11Z (in ~12
    min)"."""
    if not text or "T" not in text:
        return text
    now = now or _now()

    def add(match: re.Match[str]) -> str:
        at = _parse(match.group(1))
        return f"{match.group(1)} ({relative(at, now)})" if at else match.group(1)

    return ISO_TIME.sub(add, text)


def window_words(
    start: datetime | None,
    earliest: datetime | None,
    latest: datetime | None,
    now: datetime | None = None,
) -> str:
    """ "in ~12 min, likely 8-20 min" (the estimate and its window from now), "" without one."""
    if start is None:
        return ""
    now = now or _now()
    words = relative(start, now)
    if earliest is not None and latest is not None and latest > earliest:
        low = max((earliest - now).total_seconds(), 0)
        high = max((latest - now).total_seconds(), 0)
        _, unit = _span(high)
        scale = {"s": 1, "min": 60, "h": 3600, "d": 86400}[unit]
        words += f", likely {low / scale:.0f}-{high / scale:.0f} {unit}"
    return words
