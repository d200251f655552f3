"""The usage page's GPU hours per day: an SVG chart with a y axis in GPU hours and one date label
per day. A day of a few GPU-minutes is a small bar on an axis of at least one GPU hour, labelled
with its value, not a full-height bar labelled "0.0"."""

import re
from datetime import timedelta

from django.utils import timezone

from apps.jobs.models import GpuAllocation, Job
from apps.web.selectors import axis_top
from tests.web import runs
from tests.web.test_pages import submit


def _chart(page: str) -> str:
    return re.search(r'<svg id="usage-chart".*?</svg>', page, re.S).group(0)


def test_a_few_gpu_minutes_make_a_small_bar_on_a_labelled_axis(browser_as):
    bob = browser_as("bob")
    submit(bob, gpus="1")
    job = Job.objects.get()
    runs.finish(runs.start(job))
    ended = timezone.now() - timedelta(minutes=1)
    GpuAllocation.objects.filter(attempt__job=job).update(
        allocated_at=ended - timedelta(minutes=3), released_at=ended
    )  # 3 GPU-minutes today
    chart = _chart(bob.get("/usage/").content.decode())
    ticks = re.findall(r'<text class="tick y-tick"[^>]*>([^<]*)</text>', chart)
    assert ticks == ["0", "0.5", "1"]  # the y axis, in GPU hours
    days = re.findall(r'<text class="tick x-tick"[^>]*>([^<]*)</text>', chart)
    assert len(days) == 14 and days[-1] == str(timezone.now().day)  # one label per day
    assert len(set(days)) == 14
    bars = re.findall(r'<rect class="day-bar"[^>]*height="([\d.]+)"', chart)
    assert len(bars) == 1 and 0 < float(bars[0]) < 10  # of the axis' 140 units
    assert re.findall(r'<text class="tick value"[^>]*>([^<]*)</text>', chart) == ["0.05"]
    assert " style=" not in chart


def test_the_axis_top_rounds_the_busiest_day_up():
    assert axis_top(0.0) == 1 and axis_top(0.05) == 1
    assert axis_top(1.3) == 2 and axis_top(3) == 5 and axis_top(7.5) == 10 and axis_top(40) == 50


def test_each_day_is_labelled_once(browser_as):
    page = browser_as("bob").get("/usage/").content.decode()
    today = timezone.now().strftime("%b %-d")
    # The old table's second label per day is gone: days are named only on the charts' axes.
    outside_charts = re.sub(r"<svg.*?</svg>", "", page, flags=re.S)
    assert outside_charts.count(f">{today}<") == 0
    assert len(re.findall(r'class="tick x-tick"', _chart(page))) == 14
