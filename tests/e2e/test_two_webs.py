"""Two web servers (each its own gunicorn worker process) on one database and one Redis: a revoked
token is refused by both within 2 s although each had it cached (apps/tenants/token_cache.py),
a lowered quota holds in both within 2 s although each kept the submitter
(apps/admission/submitters.py), and 8 clients submitting as fast as they can across both are admitted no more than the shared
buckets allow (apps/admission/leases.py; the bound is written in docs/admission.md)."""

from __future__ import annotations

import sys
import threading
import time

import pytest
import requests

from tests.e2e.platform import ROOT, Platform, free_port

pytestmark = pytest.mark.timeout(300)

RATE, BURST = 120, 5  # a small limit: 2 submits a second, 5 at once
CLIENTS, SECONDS = 8, 4.0
# What docs/admission.md ("Rate limits") writes down: leases never pass the shared buckets.
OVER_ADMISSION_BOUND = 0


@pytest.fixture(scope="module")
def webs(tmp_path_factory):
    """The platform's database, seeded, and two web servers; no dispatcher or agents (nothing
    here runs a job). Tokens stay cached up to 60 s, so that only the revocation's message can
    end them within the test's 2 s."""
    platform = Platform(
        tmp_path_factory.mktemp("two_webs"), name="gpuplatform_e2e_two_webs", own_redis=True,
        env={"GPUPLATFORM_TOKEN_CACHE_SECONDS": "60"},
    )  # fmt: skip
    try:
        platform.manage("migrate", "--noinput", "-v", "0")
        platform.tokens = seed(platform)
        urls = []
        for name in ("web-a", "web-b"):
            port = free_port()
            platform.spawn(name, [sys.executable, "-m", "gunicorn", "gpuplatform.asgi:application",
                                  "--worker-class", "gpuplatform.web_worker.Worker",
                                  f"--bind=127.0.0.1:{port}", "--workers", "1", "--threads", "4"])  # fmt: skip
            urls.append(f"http://127.0.0.1:{port}")
        for url in urls:
            platform.wait_until(lambda url=url: answers(url), timeout=60, what=f"web at {url}")
        yield platform, urls
    finally:
        platform.stop()


def seed(platform: Platform) -> dict[str, str]:
    import json
    import subprocess

    done = subprocess.run([sys.executable, "-m", "tests.e2e.seed"], cwd=ROOT,
                          env=platform.env, check=True, capture_output=True, text=True)  # fmt: skip
    return json.loads(done.stdout.strip().splitlines()[-1])


def answers(url: str) -> bool:
    try:
        return requests.get(url + "/healthz", timeout=2).status_code == 200
    except requests.RequestException:
        return False


def get(url: str, key: str) -> int:
    return requests.get(
        url + "/api/v1/usage/", headers={"Authorization": f"Token {key}"}, timeout=10
    ).status_code


def new_token(platform: Platform, username: str) -> str:
    out = platform.manage("create_user", username, "--tenant", "acme", "--token")
    return out.strip().splitlines()[-1].split()[-1]


def test_a_revoked_token_is_refused_by_every_web_within_2_s(webs):
    platform, urls = webs
    key = new_token(platform, "frank")
    for url in urls:
        assert get(url, platform.tokens["alice"]) == 200  # each web's listener subscribes now...
    time.sleep(1.5)  # ...and drops its cache once subscribed
    assert [get(url, key) for url in urls] == [200, 200]  # cached in both

    platform.manage("revoke_token", "frank", "--all")
    revoked_at = time.monotonic()  # the command has committed and published by now

    refused_after = {}
    while len(refused_after) < len(urls) and time.monotonic() - revoked_at < 10:
        for url in urls:
            if url not in refused_after and get(url, key) == 401:
                refused_after[url] = time.monotonic() - revoked_at
        time.sleep(0.02)
    print(f"revocation to 401 on each web: {refused_after}")
    assert set(refused_after) == set(urls), refused_after
    assert max(refused_after.values()) < 2.0, refused_after
    assert [get(url, platform.tokens["alice"]) for url in urls] == [200, 200]  # others unaffected


def submit_plain(url: str, key: str) -> requests.Response:
    """A body that names no template or SKU: its submitter comes from the web's cache once kept
    (apps/admission/submitters.py)."""
    return requests.post(url + "/api/v1/jobs/", json={"command": ["true"], "gpus": 1},
                         headers={"Authorization": f"Token {key}"}, timeout=10)  # fmt: skip


def test_a_lowered_quota_is_enforced_by_every_web_within_2_s(webs):
    """Each web keeps bob's tenant and quota with his membership; `set_quota` drops them in both
    through the revocation channel, so a cap lowered below the queue refuses the next submits."""
    platform, urls = webs
    key = platform.tokens["bob"]  # acme: may run commands
    platform.manage("set_quota", "acme", "--submit-rate", "1000000", "--submit-burst", "100000",
                    "--max-queued-jobs", "100000")  # fmt: skip
    for url in urls:
        assert get(url, platform.tokens["alice"]) == 200  # each web's listener subscribes now...
    time.sleep(1.5)  # ...and drops its caches once subscribed
    for url in urls:
        for _ in range(2):  # the first reads bob's submitter with his token, the second kept it
            assert submit_plain(url, key).status_code == 201

    platform.manage("set_quota", "acme", "--max-queued-jobs", "1")
    lowered_at = time.monotonic()  # the command has committed and published by now

    refused_after = {}
    while len(refused_after) < len(urls) and time.monotonic() - lowered_at < 10:
        for url in urls:
            answer = submit_plain(url, key)
            if url not in refused_after and answer.status_code == 429:
                assert "jobs queued" in answer.text, answer.text
                refused_after[url] = time.monotonic() - lowered_at
        time.sleep(0.02)
    print(f"lowered cap to refusal on each web: {refused_after}")
    assert set(refused_after) == set(urls), refused_after
    assert max(refused_after.values()) < 2.0, refused_after


def test_8_clients_on_two_webs_get_no_more_than_the_shared_buckets_allow(webs):
    platform, urls = webs
    platform.manage("set_quota", "globex", "--submit-rate", str(RATE), "--submit-burst", str(BURST),
                    "--max-queued-jobs", "100000")  # fmt: skip
    key = platform.tokens["dave"]  # globex
    body = {"template": "demo-train", "params": {"steps": 1}, "gpus": 1}
    codes: list[int] = []
    retry_afters: list[str | None] = []
    lock = threading.Lock()
    start = threading.Barrier(CLIENTS)

    def client(index: int) -> None:
        session = requests.Session()
        session.headers["Authorization"] = f"Token {key}"
        url = urls[index % len(urls)] + "/api/v1/jobs/"
        start.wait()
        while time.monotonic() < ends:
            answer = session.post(url, json=body, timeout=30)
            with lock:
                codes.append(answer.status_code)
                if answer.status_code == 429:
                    retry_afters.append(answer.headers.get("Retry-After"))

    threads = [threading.Thread(target=client, args=(i,)) for i in range(CLIENTS)]
    began = time.monotonic()
    ends = began + SECONDS
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    elapsed = time.monotonic() - began

    admitted, refused = codes.count(201), codes.count(429)
    allowed = BURST + RATE / 60 * elapsed
    print(f"{len(codes)} submits in {elapsed:.2f} s: {admitted} admitted, {refused} refused; "
          f"the shared buckets allow {allowed:.1f}")  # fmt: skip
    assert set(codes) <= {201, 429}, codes
    assert admitted <= allowed + OVER_ADMISSION_BOUND
    assert admitted >= BURST  # the limit admits, it does not only refuse
    assert refused > 0 and all(r is not None and int(r) >= 1 for r in retry_afters)
