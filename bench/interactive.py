"""Interactive sessions through the relay (docs/interactive.md), on real processes: the web
(gunicorn 2x4 with its relay), a dispatcher, one root agent fencing its jobs, the client's own
session code.

1. the keystroke round trip: one byte typed into a shell's terminal until its echo is back
   (client -> web -> Redis -> web -> agent -> PTY and back), p50 and p95 over 300 keys;
2. port-forward throughput (`gpuplatform port-forward`, a job's TCP server sending 200 MiB),
   beside a direct loopback copy of the same stream;
3. 50 sessions open at once: /healthz p95 meanwhile, and the web's memory per session.

`python -m bench.interactive` writes docs/bench/60-interactive.md.
"""

from __future__ import annotations

import os
import pathlib
import socket
import statistics
import subprocess
import sys
import tempfile
import time

import requests

ROOT = pathlib.Path(__file__).resolve().parent.parent
OUT = ROOT / "docs" / "bench" / "60-interactive.md"
KEYS = 300
STREAM_MIB = 200
SESSIONS = 50
SEND = (  # a job's TCP server: STREAM_MIB of zeros to whoever connects (one line: argv)
    "import socket; s = socket.create_server(('127.0.0.1', {port})); chunk = bytes(1 << 20); "
    "[([c.sendall(chunk) for _ in range({mib})], c.close()) for c, _ in iter(s.accept, None)]"
)


def percentile(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(p / 100 * (len(ordered) - 1))))]


def keystrokes(client, job_id: str) -> list[float]:
    from gpuplatform_client.interactive import DATA, Connection

    times = []
    with Connection.open(client, job_id, {"kind": "exec", "argv": ["cat"], "tty": True}) as conn:
        for _ in range(KEYS):
            began = time.perf_counter()
            conn.send(b"x")
            while True:
                frame = conn.ws.recv(timeout=30)
                if frame[:1] == DATA and b"x" in frame:
                    break
            times.append(time.perf_counter() - began)
    return times


def read_all(port: int) -> tuple[int, float]:
    began = time.perf_counter()
    total = 0
    with socket.create_connection(("127.0.0.1", port), timeout=60) as sock:
        while data := sock.recv(1 << 20):
            total += len(data)
    return total, time.perf_counter() - began


def forward_throughput(platform, job_id: str, port: int) -> dict:
    from tests.e2e.platform import free_port
    from tests.e2e.test_interactive import client_env

    direct = [read_all(port) for _ in range(2)]
    local = free_port()
    forward = subprocess.Popen([sys.executable, "-m", "gpuplatform_client", "port-forward", job_id, f"{local}:{port}"],
                               env=client_env(platform, "alice"), stdout=subprocess.PIPE, text=True)  # fmt: skip
    try:
        assert forward.stdout is not None and forward.stdout.readline().startswith("Forwarding")
        relayed = [read_all(local) for _ in range(2)]
    finally:
        forward.kill()
    for total, _ in direct + relayed:
        assert total == STREAM_MIB * 2**20, total
    best = lambda runs: max(total / seconds for total, seconds in runs) / 2**20  # noqa: E731
    return {"direct": best(direct), "relayed": best(relayed)}


def web_rss_kib() -> int:
    """The web's resident memory: gunicorn's master and its workers, summed."""
    total = 0
    for entry in pathlib.Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes()
            status = (entry / "status").read_text()
        except OSError:
            continue
        if b"gpuplatform.asgi:application" in cmdline:
            for line in status.splitlines():
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1])
    return total


def settled_rss() -> float:
    """The median of five readings a second apart: a worker's heap moves by itself."""
    readings = []
    for _ in range(5):
        readings.append(web_rss_kib())
        time.sleep(1)
    return statistics.median(readings)


def healthz_p95(url: str, count: int = 100) -> float:
    times = []
    with requests.Session() as http:
        for _ in range(count):
            began = time.perf_counter()
            assert http.get(url + "/healthz", timeout=10).status_code == 200
            times.append(time.perf_counter() - began)
            time.sleep(0.02)
    return percentile(times, 95)


def many_sessions(platform, client, job_id: str) -> dict:
    from gpuplatform_client.interactive import Connection

    before = healthz_p95(platform.url)
    before_rss = settled_rss()
    conns = [
        Connection.open(client, job_id, {"kind": "exec", "argv": ["sleep", "600"]})
        for _ in range(SESSIONS)
    ]
    time.sleep(5)  # every agent leg attached
    during = healthz_p95(platform.url)
    during_rss = settled_rss()
    for conn in conns:
        conn.ws.close()
    return {"before": before, "during": during, "rss_per_session_kib": (during_rss - before_rss) / SESSIONS,
            "rss_before_mib": before_rss / 1024}  # fmt: skip


def measure(data_dir: pathlib.Path) -> dict:
    os.environ.setdefault("SECRET_KEY", "bench-only")
    from gpuplatform_client.api import Client
    from tests.e2e.platform import Platform, free_port

    platform = Platform(data_dir, name="gpuplatform_bench_interactive", own_redis=True,
                        env={"GPUPLATFORM_MAX_SESSIONS_PER_USER": str(SESSIONS + 10)})  # fmt: skip
    platform.start({"ib-h1": ("H100-80GB", 4, "")})
    try:
        if platform.nodes()["ib-h1"]["isolation"] == "none":
            raise SystemExit(
                "bench.interactive: the agent cannot fence jobs here (needs root and cgroups)"
            )
        client = Client(platform.url, platform.tokens["alice"])
        shell = platform.submit("alice", command=["sleep", "900"], gpus=1)
        port = free_port()
        server = platform.submit(
            "alice", command=["{python}", "-c", SEND.format(port=port, mib=STREAM_MIB)], gpus=1
        )
        for job in (shell, server):
            platform.wait_for_state(job["id"], "running", timeout=120)
        time.sleep(2)  # the server listens
        keys = keystrokes(client, shell["id"])
        crowd = many_sessions(platform, client, shell["id"])  # before the stream fills any buffer
        throughput = forward_throughput(platform, server["id"], port)
    finally:
        platform.stop()
    return {"keys": keys, "throughput": throughput, "crowd": crowd}


def write(result: dict) -> None:
    keys, flow, crowd = result["keys"], result["throughput"], result["crowd"]
    rows = [
        (f"keystroke round trip through the relay, p50 ({KEYS} keys)", f"{statistics.median(keys) * 1000:.1f} ms",
         "at most 20 ms"),
        ("keystroke round trip, p95", f"{percentile(keys, 95) * 1000:.1f} ms", ""),
        (f"port-forward throughput ({STREAM_MIB} MiB, best of 2)", f"{flow['relayed']:.0f} MiB/s", "at least 50 MB/s"),
        ("the same stream copied directly on loopback", f"{flow['direct']:.0f} MiB/s", ""),
        ("/healthz p95, no session open", f"{crowd['before'] * 1000:.1f} ms", ""),
        (f"/healthz p95 with {SESSIONS} sessions open", f"{crowd['during'] * 1000:.1f} ms", "under 200 ms"),
        ("the web's memory per open session (both legs; RSS of gunicorn's master and 2 workers)",
         f"{crowd['rss_per_session_kib']:.0f} KiB ({crowd['rss_before_mib']:.0f} MiB before)", ""),
    ]  # fmt: skip
    lines = [
        "## Interactive sessions: the relay\n",
        "Command: `python -m bench.interactive` (SQLite (embedded default), its own Redis, gunicorn 2x4 "
        "with the relay, one dispatcher, one root agent fencing its jobs; all on the 2-core machine "
        "shared with other work).\n",
        "| figure | value | target (issue 33) |",
        "|---|---|---|",
        *[f"| {name} | {value} | {target} |" for name, value, target in rows],
        "",
        "A keystroke is one byte sent on an open exec session's websocket (a `cat` on a PTY, whose "
        "echo comes back at once), timed until the echo arrives. Throughput is read from the local "
        "end of `gpuplatform port-forward` (the client, the relay through Redis, the agent, the job's "
        "socket). Memory is the web processes' resident set, measured after the sessions attached; "
        "it is noisy (a worker's heap moves by more than 50 sessions take).\n",
    ]
    OUT.write_text("\n".join(lines))


def main() -> int:
    with tempfile.TemporaryDirectory(prefix="bench-interactive-") as tmp:
        result = measure(pathlib.Path(tmp))
    write(result)
    print(OUT.read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
