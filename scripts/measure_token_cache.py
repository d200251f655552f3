"""What an authenticated request costs with and without the token cache and the rate limits'
leases (issue 35): two web servers side by side on one database and one Redis, one with both
(the defaults), one with both off (GPUPLATFORM_TOKEN_CACHE_SECONDS=0,
GPUPLATFORM_RATE_LIMIT_LEASE_SECONDS=0: a token read and a Redis round trip per request, as
before). One client, requests one after another, the two servers in turn, ROUNDS rounds.
Per request: the client's wall time and the web worker's CPU time (/proc).

    python -m scripts.measure_token_cache [--requests 500] [--rounds 5]

Prints medians over the rounds and the ratio (on / off). DATABASE_URL=postgres://... measures
on a fresh PostgreSQL database beside it; SQLite otherwise.
"""

from __future__ import annotations

import argparse
import os
import pathlib
import statistics
import sys
import tempfile
import time

import requests

from tests.e2e.platform import ROOT, Platform, free_port

OFF = {"GPUPLATFORM_TOKEN_CACHE_SECONDS": "0", "GPUPLATFORM_RATE_LIMIT_LEASE_SECONDS": "0"}
BODY = {"template": "demo-train", "params": {"steps": 1}, "gpus": 1}


def worker_cpu(master_pid: int) -> float:
    """CPU seconds (user + system) of the gunicorn master's children: its one worker."""
    total = 0.0
    tick = os.sysconf("SC_CLK_TCK")
    children = pathlib.Path(f"/proc/{master_pid}/task/{master_pid}/children").read_text().split()
    for pid in children:
        fields = pathlib.Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        total += (int(fields[11]) + int(fields[12])) / tick
    return total


def start(platform: Platform, name: str, env: dict[str, str]) -> tuple[str, int]:
    port = free_port()
    process = platform.spawn(name, [sys.executable, "-m", "gunicorn", "gpuplatform.asgi:application",
                                    "--worker-class", "gpuplatform.web_worker.Worker",
                                    f"--bind=127.0.0.1:{port}", "--workers", "1", "--threads", "4"],
                             env={**platform.env, **env})  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    platform.wait_until(lambda: _answers(url), timeout=60, what=name)
    return url, process.pid


def _answers(url: str) -> bool:
    try:
        return requests.get(url + "/healthz", timeout=2).status_code == 200
    except requests.RequestException:
        return False


def batch(session: requests.Session, url: str, pid: int, n: int, kind: str) -> tuple[float, float]:
    """(ms of wall time, ms of worker CPU) per request, over n requests."""
    cpu, began = worker_cpu(pid), time.perf_counter()
    for _ in range(n):
        if kind == "GET":
            answer = session.get(url + "/api/v1/templates/", timeout=30)
            assert answer.status_code == 200, answer.text
        else:
            answer = session.post(url + "/api/v1/jobs/", json=BODY, timeout=30)
            assert answer.status_code == 201, answer.text
    wall = time.perf_counter() - began
    return wall / n * 1000, (worker_cpu(pid) - cpu) / n * 1000


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--requests", type=int, default=500)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        platform = Platform(pathlib.Path(tmp), name="gpuplatform_measure_tokens", own_redis=True)
        try:
            platform.manage("migrate", "--noinput", "-v", "0")
            import json
            import subprocess

            seeded = subprocess.run([sys.executable, "-m", "tests.e2e.seed"], cwd=ROOT, env=platform.env,
                                    check=True, capture_output=True, text=True)  # fmt: skip
            key = json.loads(seeded.stdout.strip().splitlines()[-1])["dave"]
            platform.manage("set_quota", "globex", "--submit-rate", "1000000", "--submit-burst", "1000000",
                            "--max-queued-jobs", "10000000")  # fmt: skip
            servers = {"on": start(platform, "web-on", {}), "off": start(platform, "web-off", OFF)}
            session = requests.Session()
            session.headers["Authorization"] = f"Token {key}"
            for url, pid in servers.values():  # warm: imports, first statements, first lease
                batch(session, url, pid, 20, "GET")
                batch(session, url, pid, 20, "POST")
            figures: dict[tuple[str, str], list[tuple[float, float]]] = {}
            per_round = max(1, args.requests // args.rounds)
            for number in range(args.rounds):
                order = ["on", "off"] if number % 2 == 0 else ["off", "on"]
                for kind in ("GET", "POST"):
                    for name in order:
                        url, pid = servers[name]
                        figures.setdefault((kind, name), []).append(
                            batch(session, url, pid, per_round, kind)
                        )
            database = (
                "PostgreSQL" if platform.env["DATABASE_URL"].startswith("postgres") else "SQLite"
            )
            print(f"{database}, {args.rounds} rounds x {per_round} requests each, one client")
            for kind in ("GET", "POST"):
                on = [statistics.median(v[i] for v in figures[(kind, "on")]) for i in (0, 1)]
                off = [statistics.median(v[i] for v in figures[(kind, "off")]) for i in (0, 1)]
                print(f"{kind:4} wall ms/request: on {on[0]:.2f}, off {off[0]:.2f}, ratio {on[0] / off[0]:.2f}; "
                      f"worker CPU ms/request: on {on[1]:.2f}, off {off[1]:.2f}, ratio {on[1] / off[1]:.2f}")  # fmt: skip
                for name in ("on", "off"):
                    rounds = ", ".join(f"{w:.2f}/{c:.2f}" for w, c in figures[(kind, name)])
                    print(f"     {name:3} per round (wall/CPU ms): {rounds}")
        finally:
            platform.stop()


if __name__ == "__main__":
    main()
