"""Where the CPU of a submit and of a drained job goes, per platform process.

    python -m bench._cpu_split [--count 1000] [--spy DIR]

bench.slurm_peer's shapes on one platform: 4 nodes x 4 fake GPUs registered, then lost (their
agents stopped); `count` one-GPU `true` jobs submitted by 8 client threads; the agents started
again and the queue drained. Prints the CPU seconds (psutil: the process and its descendants,
live and reaped) each process used, divided by the submits and by the jobs drained, and the
bench client's own, and the dispatcher's passes in each phase. `--spy DIR`: py-spy (if installed) records the web, the dispatcher and one
agent for 8 s of each phase, GIL-holding samples only, into DIR/<phase>.<process> (raw
folded stacks). `--unfenced`: the agents run jobs with GPUPLATFORM_ISOLATION=none (what the
fence costs). `--requests`: the web logs the agent API's access lines
(GPUPLATFORM_AGENT_ACCESS_LOG=1, which costs the web a little) and the drain's agent requests a
drained job are printed by endpoint. On PostgreSQL the platform database's backends (the
server's processes serving its connections, polled every 0.1 s so that one that exits keeps what
it used) are counted as `pg-backends`, and the server's own processes (walwriter, checkpointer,
...: shared with anything else on the server) as `pg-server`. Not part of `make bench` (a tool for
finding the cost, not a figure).
"""

from __future__ import annotations

import argparse
import concurrent.futures
import contextlib
import os
import pathlib
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time

from bench.foundation import running_platform, wait_until_ended
from bench.slurm_peer import CLIENTS, GPUS, NODES, cpu_seconds, nodes_lost


def spies(platform, phase: str, out: pathlib.Path | None) -> list[subprocess.Popen]:
    spy = shutil.which("py-spy")
    if out is None or spy is None:
        return []
    out.mkdir(parents=True, exist_ok=True)
    return [
        subprocess.Popen(
            [
                spy,
                "record",
                "-r",
                "100",
                "-d",
                "8",
                "--gil",
                "-f",
                "raw",
                "-s",
                "-o",
                str(out / f"{phase}.{name}"),
                "-p",
                str(platform.processes[name].pid),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )  # fmt: skip
        for name in ("web", "dispatcher", "agent-peer-0")
        if name in platform.processes and platform.processes[name].poll() is None
    ]


class DatabaseBackends:
    """CPU seconds of the PostgreSQL server's processes that serve one database (their process
    title names it) and of its own background processes, polled in a thread: a backend that exits
    between two polls loses at most 0.1 s of its CPU to the count. Not on SQLite (`database` "")."""

    def __init__(self, database: str, processes: dict | None = None) -> None:
        self.database = f" {database} " if database else ""
        self.processes = processes or {}  # the platform's: a backend is named after its client
        self.seen: dict[int, tuple[str, float]] = {}  # pid -> (which, CPU seconds last read)
        self.owners: dict[int, str] = {}
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self._poll, daemon=True)

    def __enter__(self) -> DatabaseBackends:
        if self.database:
            self._read()
            self.thread.start()
        return self

    def __exit__(self, *_) -> None:
        self.stopping.set()
        if self.thread.is_alive():
            self.thread.join()

    def totals(self) -> dict[str, float]:
        if not self.database:
            return {}
        self._read()
        found = {"pg-backends": 0.0, "pg-server": 0.0}
        for pid, (which, used) in list(self.seen.items()):
            found[which] += used
            if which == "pg-backends":
                owner = f"pg-for-{self.owners.get(pid, 'other')}"
                found[owner] = found.get(owner, 0.0) + used
        return found

    def _owner(self, title: str) -> str:
        """The platform process whose connection a backend serves (its client port's owner)."""
        import psutil

        port = re.search(r"\(([0-9]+)\)", title)
        if port is None:
            return "other"
        for each in psutil.net_connections("tcp"):
            if each.laddr and each.laddr.port == int(port.group(1)) and each.pid:
                pids = {each.pid}
                try:
                    pids.update(p.pid for p in psutil.Process(each.pid).parents())
                except psutil.Error:
                    pass
                for name, process in self.processes.items():
                    if process.pid in pids:
                        return name.split("-peer-")[0]  # the agents together
                return "other"
        return "other"

    def _poll(self) -> None:
        while not self.stopping.wait(0.1):
            self._read()

    def _read(self) -> None:
        import psutil

        for each in psutil.process_iter(["username", "cmdline"]):
            title = " ".join(each.info["cmdline"] or [])
            if each.info["username"] != "postgres" or not title.startswith("postgres: "):
                continue
            which = "pg-backends" if self.database in title else "pg-server"
            if which == "pg-server" and re.search(r"\d+\.\d+\.\d+\.\d+\(|\[local\]", title):
                continue  # another database's backend
            try:
                times = each.cpu_times()
            except psutil.Error:
                continue
            if which == "pg-backends" and each.pid not in self.owners:
                self.owners[each.pid] = self._owner(title)
            self.seen[each.pid] = (which, times.user + times.system)


def database_name(platform) -> str:
    """The platform's PostgreSQL database, or "" on SQLite."""
    import urllib.parse

    url = platform.env.get("DATABASE_URL", "")
    return urllib.parse.urlsplit(url).path.strip("/") if url.startswith("postgres") else ""


def per_process(platform, backends: DatabaseBackends) -> dict[str, float]:
    found = {
        name: cpu_seconds(process.pid)
        for name, process in platform.processes.items()
        if process.poll() is None
    }
    return found | backends.totals()


def passes(platform) -> int:
    """The dispatcher's passes so far (apps/scheduling/figures.py keeps the count in Redis)."""
    import redis

    from apps.scheduling.figures import DISPATCH_KEY

    count = redis.Redis.from_url(platform.env["REDIS_URL"]).hget(DISPATCH_KEY, "passes_total")
    return int(count or 0)


def spent(
    platform, backends: DatabaseBackends, before: dict[str, float], count: int
) -> dict[str, float]:
    after = per_process(platform, backends)
    return {k: round((after[k] - before[k]) / count * 1000, 2) for k in after if k in before}


def agents_started(
    platform, logs: dict[str, pathlib.Path], offsets: dict[str, int]
) -> dict[str, float]:
    """Each agent's CPU seconds at the moment its Celery consumer says it is ready (its log's
    "ready." line): the agent's own start (imports, register, the worker's setup), which the
    drain's figure a job would otherwise count as if the jobs had cost it. Polled every 5 ms
    for at most 60 s; an agent not seen ready is left out."""
    found: dict[str, float] = {}
    deadline = time.monotonic() + 60
    while len(found) < len(logs) and time.monotonic() < deadline:
        for node, log in logs.items():
            name = f"agent-{node}"
            if name in found or not log.exists():
                continue
            with open(log, "rb") as lines:
                lines.seek(offsets[node])
                if b" ready." in lines.read():
                    found[name] = cpu_seconds(platform.processes[name].pid)
        time.sleep(0.005)
    return found


def agent_tree(platform, name: str, count: int) -> str:
    """One agent's CPU (since its start) by process: itself, its fork server (with the jobs it
    forked and reaped: `children`), its reaper, ...; user and system, ms a drained job."""
    import psutil

    if name not in platform.processes:
        return ""
    root = psutil.Process(platform.processes[name].pid)
    parts = []
    for each in [root, *root.children(recursive=True)]:
        try:
            t, what = (
                each.cpu_times(),
                " ".join(each.cmdline()[1:4]).replace(str(platform.data_dir), ""),
            )
        except psutil.Error:
            continue
        ms = [
            round(x / count * 1000, 2)
            for x in (t.user, t.system, t.children_user, t.children_system)
        ]
        parts.append(
            f"  {what[:60]}: user {ms[0]}, sys {ms[1]}, children user {ms[2]}, sys {ms[3]}"
        )
    return f"{name}'s processes, CPU ms a drained job (all jobs, not its own):\n" + "\n".join(parts)


def agent_requests(log: pathlib.Path, offset: int, count: int) -> str:
    """The agent API's access lines in the web's log after `offset`, a drained job, by endpoint
    (ids replaced by N)."""
    from collections import Counter

    with open(log, "rb") as lines:
        lines.seek(offset)
        found = re.findall(rb'"(GET|POST|PUT|PATCH) /internal/agent/v1/([^ ?"]*)', lines.read())
    kinds = Counter(f"{m.decode()} {re.sub(r'[0-9]+', 'N', p.decode())}" for m, p in found)
    each = ", ".join(f"{k} {n / count:.3f}" for k, n in kinds.most_common())
    return f"agent requests a drained job: {sum(kinds.values()) / count:.3f} ({each})"


def refused_batches(log: pathlib.Path, offset: int) -> str:
    """How many of the drain's report batches met a row that had moved since it was read and went
    one by one (apps/jobs/batch_reports.py logs each): the batch path's figures assume few."""
    if not log.exists():
        return "report batches applied one by one: (no web log)"
    with open(log, "rb") as lines:
        lines.seek(offset)
        count = lines.read().count(b"applied one by one")
    return f"report batches applied one by one: {count}"


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--count", type=int, default=1000)
    parser.add_argument("--spy", type=pathlib.Path)
    parser.add_argument(
        "--unfenced", action="store_true", help="agents with GPUPLATFORM_ISOLATION=none"
    )
    parser.add_argument("--requests", action="store_true",
                        help="count the agents' requests during the drain (web access log)")  # fmt: skip
    args = parser.parse_args()
    if args.requests:
        os.environ["GPUPLATFORM_AGENT_ACCESS_LOG"] = "1"
    if args.unfenced:
        os.environ["GPUPLATFORM_ISOLATION"] = "none"  # the platform's processes inherit it
        print("unfenced: the agents run jobs with GPUPLATFORM_ISOLATION=none")
    nodes = {f"peer-{i}": ("H100-80GB", GPUS, "") for i in range(NODES)}
    with tempfile.TemporaryDirectory(prefix="gpuplatform-cpu-") as tmp:
        with contextlib.ExitStack() as stack:
            platform = stack.enter_context(running_platform(pathlib.Path(tmp), nodes, "cpu"))
            backends = stack.enter_context(
                DatabaseBackends(database_name(platform), platform.processes)
            )
            nodes_lost(platform, nodes)
            sessions = [platform.api("bob") for _ in range(CLIENTS)]
            url = platform.url + "/api/v1/jobs/"
            local = threading.local()

            def submit(i: int) -> None:
                if not hasattr(local, "session"):
                    local.session = sessions[i % CLIENTS]
                answer = local.session.post(url, json={"command": ["true"], "gpus": 1}, timeout=60)
                assert answer.status_code == 201, answer.text

            before, mine, began = (
                per_process(platform, backends),
                time.process_time(),
                time.monotonic(),
            )
            ran = passes(platform)
            watching = spies(platform, "submit", args.spy)
            with concurrent.futures.ThreadPoolExecutor(CLIENTS) as pool:
                list(pool.map(submit, range(args.count)))
            rate = args.count / (time.monotonic() - began)
            split = spent(platform, backends, before, args.count)
            client = (time.process_time() - mine) / args.count * 1000
            print(f"submit: {rate:.0f}/s; CPU ms a submit: {split}, the client {client:.2f}; "
                  f"{passes(platform) - ran} dispatcher passes")  # fmt: skip
            for spy in watching:
                spy.wait()

            web_log = platform.data_dir / "web.log"
            log_at = web_log.stat().st_size if web_log.exists() else 0
            logs = {node: platform.data_dir / f"agent-{node}.log" for node in nodes}
            offsets = {
                node: log.stat().st_size if log.exists() else 0 for node, log in logs.items()
            }
            for node in nodes:
                platform.restart_agent(node)
            before, began, ran = per_process(platform, backends), time.monotonic(), passes(platform)
            started = agents_started(platform, logs, offsets)
            # After the agents' start, so that an agent's profile is the drain's, not its imports.
            watching = spies(platform, "drain", args.spy)
            wait_until_ended(platform, args.count, interval=1.0)
            rate = args.count / (time.monotonic() - began)
            print(f"drain: {rate:.1f} jobs/s (from the agents' start); CPU ms a job: "
                  f"{spent(platform, backends, before, args.count)}; {passes(platform) - ran} dispatcher "
                  "passes")  # fmt: skip
            if started:
                after = per_process(platform, backends)
                print("an agent's own start (until its Celery consumer is ready), CPU s: "
                      f"{ {k: round(v - before[k], 2) for k, v in started.items()} }; the rest, "
                      "CPU ms a job: "
                      f"{ {k: round((after[k] - v) / args.count * 1000, 2) for k, v in started.items()} }")  # fmt: skip
            print(agent_tree(platform, "agent-peer-0", args.count))
            if args.requests:
                print(agent_requests(web_log, log_at, args.count))
            print(refused_batches(web_log, log_at))
            for spy in watching:
                spy.wait()
    return 0


if __name__ == "__main__":
    sys.exit(main())
