"""What an authenticated request costs with and without the token cache and the rate limits'
leases (issue 35): two web servers side by side on one database and one Redis, one with both
(the defaults), one with both off (GPUPLATFORM_TOKEN_CACHE_SECONDS=0,
GPUPLATFORM_RATE_LIMIT_LEASE_SECONDS=0: a token read and a Redis round trip per request, as
before). One client, requests one after another, the two servers in turn, ROUNDS rounds.
Per request: the client's wall time and the web worker's CPU time (/proc).

    SECRET_KEY=x python -m scripts.measure_token_cache [--requests 1000] [--rounds 10]

Prints medians over the rounds and the median of the rounds' ratios (on / off; each round runs
the two servers back to back, in alternating order). DATABASE_URL=postgres://... measures
on a fresh PostgreSQL database beside it; SQLite otherwise.
"""

from __future__ import annotations

import argparse
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
    """CPU seconds of the gunicorn master's children (its one worker), all their threads, from
    the scheduler's nanosecond counts (/proc/.../schedstat; /proc's stat counts 10 ms ticks)."""
    total = 0
    children = pathlib.Path(f"/proc/{master_pid}/task/{master_pid}/children").read_text().split()
    for pid in children:
        for task in pathlib.Path(f"/proc/{pid}/task").iterdir():
            try:
                total += int((task / "schedstat").read_text().split()[0])
            except (FileNotFoundError, ProcessLookupError):
                pass  # a thread that ended meanwhile
    return total / 1e9


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
    parser.add_argument("--requests", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=10)
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
            print(f"{database}, {args.rounds} rounds x {per_round} requests each, one client; "
                  "ratio: the median of the rounds' on/off ratios")  # fmt: skip
            for kind in ("GET", "POST"):
                on, off = figures[(kind, "on")], figures[(kind, "off")]
                line = [kind]
                for i, what in ((0, "wall"), (1, "worker CPU")):
                    ratio = statistics.median(a[i] / b[i] for a, b in zip(on, off, strict=True))
                    line.append(f"{what} ms/request: on {statistics.median(v[i] for v in on):.2f}, "
                                f"off {statistics.median(v[i] for v in off):.2f}, ratio {ratio:.2f}")  # fmt: skip
                print(f"{line[0]}: " + "; ".join(line[1:]))
                for name in ("on", "off"):
                    rounds = ", ".join(f"{w:.2f}/{c:.2f}" for w, c in figures[(kind, name)])
                    print(f"     {name:3} per round (wall/CPU ms): {rounds}")
        finally:
            platform.stop()


if __name__ == "__main__":
    main()
