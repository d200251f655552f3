"""Filters the pages share: a span of time in words a person reads at a glance."""

from datetime import timedelta

from django import template

register = template.Library()


@register.filter
def duration(value) -> str:
    """3725 s (or a timedelta) as "1 h 02 min", 65 s as "1 min 05 s", 7 s as "7 s"; "" for none."""
    if value is None or value == "":
        return ""
    seconds = round(value.total_seconds() if isinstance(value, timedelta) else float(value))
    seconds = max(0, seconds)
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    if hours >= 24:
        return f"{hours // 24} d {hours % 24:02d} h"
    if hours:
        return f"{hours} h {minutes:02d} min"
    if minutes:
        return f"{minutes} min {secs:02d} s"
    return f"{secs} s"


@register.filter
def gpu_hours(value) -> str:
    """GPU-hours to two decimals, a small non-zero use as "<0.01" rather than "0.00"."""
    if value is None or value == "":
        return ""
    hours = float(value)
    if 0 < hours < 0.01:
        return "<0.01"
    return f"{hours:.2f}"
