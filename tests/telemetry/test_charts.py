"""The job page's GPU charts (templates/web/_gpu_charts.html, apps/telemetry/charts.py): an SVG
per GPU with utilisation and memory over time, both axes labelled with units, UTC clock labels,
no inline style; live through the job's event stream, whose `gpu` events carry new samples."""

import asyncio
import re
import time

from django.test import Client

from apps.jobs.event_hub import Cursor, Subscriber, gpu_samples
from apps.telemetry.charts import nice_ceiling
from tests.factories import make_node
from tests.telemetry.test_storage import heartbeat, running, sample


def page(cast, job, user="bob") -> str:
    client = Client()
    client.force_login(cast[user][0])
    return client.get(f"/jobs/{job.pk}/").content.decode()


def test_a_chart_per_gpu_with_axes_units_and_time_labels(cast):
    make_node("h1", gpus=4)
    job, attempt = running(cast, gpus=2)
    held = attempt.members.get().gpu_indices
    assert "No GPU samples yet" in page(cast, job)
    start = time.time() - 60
    for k in range(30):
        heartbeat("h1", [sample(attempt, i, start + 2 * k, 90 if k % 2 else 10, memory=3000 + k)
                         for i in held])  # fmt: skip
    html = page(cast, job)
    card = html[html.index('id="gpu-charts"') : html.index("js/gpu_charts.js")]
    assert card.count("<svg") == 2 and card.count("<figure") == 2
    assert card.count('class="line-util"') == 2 and card.count('class="line-memory"') == 2
    for tick in ("0%", "50%", "100%", "0 MiB", "2500 MiB", "5000 MiB"):  # memory axis: 1-2-5
        assert f">{tick}</text>" in card, tick
    clock = time.strftime("%H:%M", time.gmtime(start))
    assert (
        len(re.findall(r">\d\d:\d\d:\d\d</text>", card)) == 6 and f">{clock}:" in card
    )  # 3 a chart
    assert f"h1:{held[0]}" in card and "Utilisation mean 50.0%" in card
    assert "style=" not in card and "<script>" not in html  # the CSP allows neither
    points = re.search(r'class="line-util"[^>]*points="([^"]+)"', card).group(1).split()
    assert len(points) == 30
    ys = {float(p.split(",")[1]) for p in points}
    assert len(ys) == 2  # 10% and 90%: two heights


def test_the_memory_axis_is_a_round_number():
    assert [nice_ceiling(v) for v in (0, 1, 7, 10, 11, 1500, 2001, 81920)] == [
        1, 1, 10, 10, 20, 2000, 5000, 100000]  # fmt: skip


def test_the_event_stream_carries_new_gpu_samples_of_running_jobs(cast):
    make_node("h1", gpus=2)
    job, attempt = running(cast, gpus=1)
    (index,) = attempt.members.get().gpu_indices
    now = time.time()
    heartbeat("h1", [sample(attempt, index, now - 60, 5), sample(attempt, index, now - 2, 77)])
    loop = asyncio.new_event_loop()
    subscriber = Subscriber(job_id=job.pk, cursor=Cursor(), loop=loop)
    found = gpu_samples([subscriber], {job.pk: {"state": "running"}})
    # Only the last 30 s before the stream opened, then what is newer than it has.
    assert [(s["util"], s["index"]) for s in found[job.pk]] == [(77, index)]
    assert found[job.pk][0]["t"].endswith("+00:00")
    assert gpu_samples([subscriber], {job.pk: {"state": "queued"}}) == {}
    loop.close()


def test_the_usage_page_shows_allocated_beside_used_per_day_and_per_user(cast):
    make_node("h1", gpus=4)
    job, attempt = running(cast, gpus=2)
    held = attempt.members.get().gpu_indices
    now = time.time()
    heartbeat("h1", [sample(attempt, i, now - 1, 25, seconds=720) for i in held])
    client = Client()
    client.force_login(cast["bob"][0])
    html = client.get("/usage/").content.decode()
    card = html[html.index('id="gpu-efficiency"') :]
    card = card[: card.index("</table>")]
    assert card.count('class="bar-allocated"') == 14 and card.count('class="bar-used"') == 14
    today = time.strftime("%b %-d", time.gmtime(now))
    assert card.count(f">{today}</text>") == 1  # each day labelled once
    assert ">GPU-hours</text>" in card  # the y-axis: 0 to a round number of GPU-hours
    assert ">0 h</text>" in card and ">0.05 h</text>" in card and ">0.1 h</text>" in card
    # The top tick is where a bar of the top value reaches: the plot's top.
    top_tick = re.search(r'y1="([\d.]+)" y2="[\d.]+" stroke="#e5e7eb"/>\s*<text[^>]*>0.1 h<', card)
    tallest = max(re.findall(r'class="bar-used"[^>]*y="([\d.]+)"', card), key=lambda y: -float(y))
    assert float(top_tick.group(1)) == float(tallest)
    # Used today: 2 GPUs x 0.2 h x 25% = 0.1 GPU h; the bar is drawn, not empty.
    used = re.findall(r'class="bar-used"[^>]*height="([\d.]+)"', card)
    assert float(used[-1]) > 0 and all(float(h) == 0 for h in used[:-1])
    assert "<td>bob</td>" in card and "<td>0.100</td>" in card
    assert "style=" not in card


def test_the_job_list_has_a_mean_gpu_utilisation_column(cast):
    make_node("h1", gpus=4)
    job, attempt = running(cast, gpus=1)
    quiet, _ = running(cast, gpus=1)
    (index,) = attempt.members.get().gpu_indices
    now = time.time()
    heartbeat("h1", [sample(attempt, index, now - 2, 30), sample(attempt, index, now - 1, 60)])
    client = Client()
    client.force_login(cast["bob"][0])
    html = client.get("/jobs/").content.decode()
    assert ">GPU util</th>" in html
    row = html[html.index(f'data-job="{job.pk}"') :]
    assert '<td class="hide-sm gpu-util">45%</td>' in row[: row.index("</tr>")]
    row = html[html.index(f'data-job="{quiet.pk}"') :]
    assert '<td class="hide-sm gpu-util"></td>' in row[: row.index("</tr>")]  # no sample yet
