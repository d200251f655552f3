"""bench.slurm_peer's clients: ours submit through the SDK's Client by default (`--client
requests`: a requests.Session a thread), and each side's clients' own CPU a submit is a figure of
its section (left out for runs from before it was measured)."""

import subprocess
import sys

import requests

from bench import slurm_peer
from tests.cli.fake_api import FakeApi


class FakePlatform:
    def __init__(self, url: str):
        self.url, self.tokens = url, {"bob": "tok-bob"}

    def api(self, user: str) -> requests.Session:
        session = requests.Session()
        session.headers["Authorization"] = f"Token {self.tokens[user]}"
        return session


def test_both_kinds_of_client_submit_and_read_logs_and_the_sdk_keeps_its_connection():
    fake = FakeApi()
    fake.routes[("POST", "/api/v1/jobs/")] = (201, {"id": "job-1"})
    fake.routes[("GET", "/api/v1/jobs/job-1/logs/")] = (200, "1765100000.5\n")
    try:
        for kind in ("sdk", "requests"):
            clients = slurm_peer.CLIENT_KINDS[kind](FakePlatform(fake.url))
            assert [clients.submit({"command": ["true"], "gpus": 1}) for _ in range(3)] == [
                "job-1"
            ] * 3
            assert slurm_peer.first_clock(clients.logs("job-1")) == 1765100000.5
        sdk = fake.requests[:4]
        assert {r.headers["Authorization"] for r in fake.requests} == {"Token tok-bob"}
        assert sdk[0].headers["User-Agent"] == "gpuplatform-client"
        assert len({r.port for r in sdk}) == 1  # one thread, one kept connection
    finally:
        fake.stop()


def test_the_clients_cpu_counts_the_children_reaped_meanwhile():
    before = slurm_peer.own_cpu_seconds()
    burn = "import time\nt = time.process_time()\nwhile time.process_time() - t < 0.3: pass"
    subprocess.run([sys.executable, "-c", burn], check=True)
    assert slurm_peer.own_cpu_seconds() - before >= 0.25


def pair(number: int, client_cpu: bool) -> dict:
    ours = {"submits_per_second": 200.0, "drain_jobs_per_second": 60.0, "latency_p50_ms": 40.0,
            "web_cpu_ms_per_submit": 4.2, "web_cpu_ms_per_job_end": 4.5}  # fmt: skip
    theirs = {"submits_per_second": 250.0, "drain_jobs_per_second": 28.0, "latency_p50_ms": 600.0}
    if client_cpu:
        ours["client_cpu_ms_per_submit"] = 0.3 + number / 100
        theirs["client_cpu_ms_per_submit"] = 3.0
    return {"pair": number, "load": 5.0, "ours": ours, "slurm": theirs}


def test_the_section_shows_the_clients_cpu_on_both_sides_and_names_our_client():
    text = slurm_peer.section([pair(1, True), pair(2, True)], backend="SQLite", command="c",
                              sched="s", when=slurm_peer.datetime.now(slurm_peer.UTC))  # fmt: skip
    row = next(line for line in text.splitlines() if line.startswith("| the clients' CPU"))
    assert "| 0.32 | 3.00 | 0.10x | 0.11x | 0.31/3.00, 0.32/3.00 |" in row
    assert "the SDK's Client" in text

    old = slurm_peer.section([pair(1, False)], backend="SQLite", command="c", sched="s",
                             when=slurm_peer.datetime.now(slurm_peer.UTC), client="requests")  # fmt: skip
    assert "the clients' CPU" not in old and "a requests.Session a thread" in old
