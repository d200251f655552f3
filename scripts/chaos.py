"""`make chaos` (`python -m scripts.chaos`): break the platform on purpose and check that every
job still finishes, once.

A whole platform (gunicorn, two dispatchers with their beats, fake-GPU node agents, its own
embedded Redis, its own database) runs two phases:

1. two dispatchers on one control queue place N short demo-train jobs of every tier with no
   faults (default N=1000);
2. chaos: M more jobs (default 250, a few gangs among them) while, at random, node agents are
   SIGKILLed and restarted, a dispatcher is SIGKILLed (and restarted), and Redis is killed and
   replaced by an empty one on the same port.

Then it reads the database (scripts/chaos_audit.py) and prints the counts: every job must be
`succeeded`, no job may ever have had two attempts running at once, no GPU may ever have been
placed twice, and no GPU may be held by an ended attempt. Exit status 1 if any check fails.
Uses SQLite unless DATABASE_URL names a PostgreSQL server (a fresh database beside it).
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import os
import pathlib
import random
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field

ROOT = pathlib.Path(__file__).resolve().parent.parent
USERS = {"enterprise": "bob", "pro": "dave", "free": "erin"}  # the e2e seed's tenants, one per tier
TENANTS = ("acme", "globex", "hobby")
CHECKS = ("jobs_with_two_attempts_running_at_once", "jobs_with_two_live_attempts", "gpu_double_placements",
          "gpus_held_by_ended_attempts", "open_members_of_ended_attempts", "members_started_twice")  # fmt: skip
# Faster than production so a run takes minutes: heartbeats every second (a node is lost after
# 3 s of silence; 0.5 s, the e2e default, loses nodes on a loaded 2-core box with nothing broken)
# and retries backing off from 0.5 s up to 4 s.
ENV = {"GPUPLATFORM_HEARTBEAT_SECONDS": "1", "GPUPLATFORM_RETRY_BACKOFF_SECONDS": "0.5",
       "GPUPLATFORM_RETRY_BACKOFF_MAX": "4", "LOG_LEVEL": "INFO"}  # fmt: skip


def start_platform(
    data_dir: pathlib.Path, *, name: str, nodes: int, gpus: int, env: dict | None = None
):
    """A platform with its own Redis (so it can be wiped), `nodes` fake nodes and two dispatchers."""
    os.environ.setdefault("SECRET_KEY", "chaos-only-not-a-secret")
    sys.path.insert(0, str(ROOT))
    from tests.e2e.platform import Platform

    platform = Platform(data_dir, name=name, own_redis=True, env={**ENV, **(env or {})})
    platform.start(
        {f"chaos-{i}": ("H100-80GB", gpus, f"rack=r{i % 2}") for i in range(1, nodes + 1)}
    )
    platform.start_dispatcher("dispatcher-b")
    for tenant in TENANTS:
        platform.manage("set_quota", tenant, "--max-queued-jobs", "100000", "--submit-rate", "100000",
                        "--submit-burst", "100000")  # fmt: skip
    return platform


def job_body(rng: random.Random, gang_share: float) -> tuple[str, dict]:
    tier = rng.choice(list(USERS))
    body = {"template": "demo-train", "gpu_sku": "H100-80GB", "name": f"chaos-{tier}",
            "params": {"steps": rng.randint(2, 6), "step_seconds": rng.choice([0.05, 0.1, 0.2])},
            "gpus": rng.choice([1, 1, 1, 2, 2, 4])}  # fmt: skip
    if rng.random() < gang_share:
        body.update(gpus=2, nodes=2)
    return USERS[tier], body


def submit(platform, user: str, body: dict, deadline: float) -> str:
    """Submit, waiting out 429/503 (rate limits, or Redis down for a fail-closed tier)."""
    import requests

    while True:
        try:
            response = platform.post(user, "/api/v1/jobs/", body)
        except requests.RequestException:
            response = None
        if response is not None and response.status_code == 201:
            return response.json()["id"]
        if time.monotonic() > deadline:
            raise RuntimeError(f"could not submit: {response.status_code if response else 'no answer'} "
                               f"{response.text[:300] if response else ''}")  # fmt: skip
        time.sleep(float(response.headers.get("Retry-After", 0.5)) if response is not None else 0.5)


def submit_all(platform, count: int, *, seed: int, gang_share: float = 0.0, threads: int = 4,
               timeout: float = 600) -> list[str]:  # fmt: skip
    rng = random.Random(seed)
    bodies = [job_body(rng, gang_share) for _ in range(count)]
    deadline = time.monotonic() + timeout
    with concurrent.futures.ThreadPoolExecutor(threads) as pool:
        return list(pool.map(lambda ub: submit(platform, ub[0], ub[1], deadline), bodies))


def counts(platform) -> dict[str, int]:
    """Ended jobs per state, as staff sees them through the API."""
    return {state: platform.get("staff", f"/api/v1/jobs/?state={state}").json()["count"]
            for state in ("succeeded", "failed", "cancelled")}  # fmt: skip


def wait_all_ended(platform, total: int, timeout: float, *, during=None) -> dict[str, int]:
    deadline = time.monotonic() + timeout
    while True:
        try:
            now = counts(platform)
        except Exception:  # the web answers again in a moment
            now = {}
        if now and now["succeeded"] + now["failed"] + now["cancelled"] >= total:
            return now
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out after {timeout}s with jobs {now}")
        for _ in range(4):  # faults at a finer grain than the (costly) polls
            if during:
                during()
            time.sleep(0.5)


@dataclass
class Faults:
    """Random faults on a running platform, each undone after a moment (the agent or the
    dispatcher restarted). The first three are one of each kind."""

    platform: object
    rng: random.Random
    gap: tuple[float, float] = (2.0, 5.0)
    agent_kills: int = 0
    dispatcher_kills: int = 0
    redis_restarts: int = 0
    dispatcher_kill_times: list[float] = field(default_factory=list)
    pending: list[tuple[float, str]] = field(default_factory=list)  # (when, process) to restart
    log: list[str] = field(default_factory=list)
    _next: float = 0.0
    _plan: list[str] = field(default_factory=list)

    def __post_init__(self):
        self._plan = self.rng.sample(["agent", "dispatcher", "redis"], 3)
        self._next = time.monotonic() + self.rng.uniform(*self.gap)

    def step(self) -> None:
        now = time.monotonic()
        for when, name in [p for p in self.pending if p[0] <= now]:
            self.pending.remove((when, name))
            self._restart(name)
        if now < self._next:
            return
        self._next = now + self.rng.uniform(*self.gap)
        planned = bool(self._plan)
        kind = (
            self._plan.pop(0)
            if planned
            else self.rng.choices(["agent", "dispatcher", "redis"], [6, 2, 2])[0]
        )
        if getattr(self, f"_{kind}")() is False and planned:
            self._plan.insert(
                0, kind
            )  # not possible right now (e.g. one dispatcher down): next time

    def _down(self) -> set[str]:
        return {name for _, name in self.pending}

    def _agent(self) -> None:
        up = sorted(n for n in self.platform.agents if f"agent-{n}" not in self._down())
        if not up:
            return False
        node = self.rng.choice(up)
        self.platform.kill(f"agent-{node}")
        self.agent_kills += 1
        self._say(f"SIGKILL agent {node}")
        self.pending.append((time.monotonic() + self.rng.uniform(0.5, 4.0), f"agent-{node}"))

    def _dispatcher(self) -> None:
        up = [d for d in ("dispatcher", "dispatcher-b") if d not in self._down()]
        if len(up) < 2:
            return False  # keep one: the point is the other taking over
        name = self.rng.choice(up)
        self.dispatcher_kill_times.append(time.time())
        self.platform.kill(name, group=True)  # with its beat
        self.dispatcher_kills += 1
        self._say(f"SIGKILL {name}")
        self.pending.append((time.monotonic() + self.rng.uniform(1.0, 5.0), name))

    def _redis(self) -> None:
        self.platform.restart_redis()
        self.redis_restarts += 1
        self._say("Redis killed and replaced by an empty one")

    def _restart(self, name: str) -> None:
        if name.startswith("agent-"):
            self.platform.restart_agent(name.removeprefix("agent-"))
        else:
            self.platform.start_dispatcher(name)
        self._say(f"restarted {name}")

    def heal(self) -> None:
        for _, name in list(self.pending):
            self._restart(name)
        self.pending.clear()

    def _say(self, text: str) -> None:
        self.log.append(f"{time.strftime('%H:%M:%S')} {text}")


def audit(platform, *, since: float = 0.0, kills: list[float] | None = None) -> dict:
    argv = [sys.executable, "-m", "scripts.chaos_audit", "--since", str(since),
            "--kills", ",".join(str(k) for k in kills or [])]  # fmt: skip
    out = subprocess.run(
        argv, cwd=ROOT, env=platform.env, check=True, capture_output=True, text=True
    ).stdout
    return json.loads(out.strip().splitlines()[-1])


def failures(result: dict, expected_jobs: int) -> list[str]:
    problems = [f"{name} = {result[name]}" for name in CHECKS if result.get(name)]
    succeeded = result["jobs_by_state"].get("succeeded", 0)
    if succeeded != expected_jobs:
        problems.append(f"{succeeded} of {expected_jobs} jobs succeeded: {result['jobs_by_state']}")
    if result["gpus_held"]:
        problems.append(f"{result['gpus_held']} GPUs still held after every job ended")
    return problems


def two_dispatchers(platform, jobs: int, *, seed: int, timeout: float) -> dict:
    """Phase 1: both dispatchers place `jobs` jobs; nothing is broken on purpose."""
    since, started, before = time.time(), time.monotonic(), sum(counts(platform).values())
    submit_all(platform, jobs, seed=seed)
    wait_all_ended(platform, before + jobs, timeout)
    result = audit(platform, since=since)
    result["seconds"] = round(time.monotonic() - started, 1)
    return result


def chaos(
    platform, jobs: int, *, seed: int, timeout: float, gap=(2.0, 5.0), gang_share: float = 0.05
) -> dict:
    """Phase 2: `jobs` jobs while agents, a dispatcher and Redis are killed at random."""
    since, started, before = time.time(), time.monotonic(), sum(counts(platform).values())
    faults = Faults(platform, random.Random(seed), gap=gap)
    submitting = threading.Thread(target=submit_all, args=(platform, jobs), daemon=True,
                                  kwargs={"seed": seed, "gang_share": gang_share, "threads": 2})  # fmt: skip
    submitting.start()
    time.sleep(1.0)
    try:
        ended = wait_all_ended(platform, before + jobs, timeout, during=faults.step)
    finally:
        faults.heal()
    submitting.join(5)
    platform.wait_until(platform.ready, timeout=120, what="every node ready again")
    platform.wait_until(lambda: audit(platform, since=since)["gpus_held"] == 0, timeout=60,
                        what="every GPU released", interval=1)  # fmt: skip
    result = audit(platform, since=since, kills=faults.dispatcher_kill_times)
    result.update(seconds=round(time.monotonic() - started, 1), api_counts=ended, agent_kills=faults.agent_kills,
                  dispatcher_kills=faults.dispatcher_kills, redis_restarts=faults.redis_restarts,
                  fault_log=faults.log)  # fmt: skip
    return result


def report(title: str, result: dict, expected: int) -> list[str]:
    problems = failures(result, expected)
    print(f"\n== {title}: {result['jobs']} jobs in {result['seconds']} s")
    print(f"jobs by tier {result['jobs_by_tier']}, gangs {result['gangs']}")
    print(f"jobs by state {result['jobs_by_state']}")
    print(f"attempts {result['attempts']} {result['attempts_by_state']}, most for one job "
          f"{result['most_attempts_of_a_job']}; GPU allocations {result['allocations']}")  # fmt: skip
    if "agent_kills" in result:
        print(f"faults: {result['agent_kills']} agents SIGKILLed and restarted, {result['dispatcher_kills']} "
              f"dispatchers SIGKILLed and restarted, {result['redis_restarts']} Redis restarts with all data gone")  # fmt: skip
        takeover = result["takeover_seconds"]
        if takeover:
            print(f"first placement after a dispatcher kill: {takeover} s (max {max(takeover)} s)")
    for name in CHECKS:
        print(f"  {name.replace('_', ' ')}: {result[name]}")
    print(f"  GPUs still held: {result['gpus_held']}")
    print("OK" if not problems else "FAILED: " + "; ".join(problems))
    return problems


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m scripts.chaos", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument(
        "--dispatch-jobs",
        type=int,
        default=1000,
        help="phase 1: jobs for two dispatchers (0 skips)",
    )
    parser.add_argument("--jobs", type=int, default=250, help="phase 2: jobs under chaos")
    parser.add_argument("--nodes", type=int, default=4)
    parser.add_argument("--gpus", type=int, default=4, help="GPUs per node")
    parser.add_argument("--seed", type=int, default=6)
    parser.add_argument("--timeout", type=float, default=1800, help="seconds per phase")
    parser.add_argument(
        "--keep", action="store_true", help="keep the platform's data dir (logs, database)"
    )
    args = parser.parse_args(argv)
    data_dir = pathlib.Path(tempfile.mkdtemp(prefix="gpuplatform-chaos-"))
    print(
        f"chaos: platform under {data_dir} ({args.nodes} nodes x {args.gpus} fake H100s, 2 dispatchers)",
        flush=True,
    )
    platform = start_platform(data_dir, name="gpuplatform_chaos", nodes=args.nodes, gpus=args.gpus)
    problems: list[str] = []
    try:
        if args.dispatch_jobs:
            result = two_dispatchers(
                platform, args.dispatch_jobs, seed=args.seed, timeout=args.timeout
            )
            problems += report("two dispatchers, no faults", result, args.dispatch_jobs)
        result = chaos(platform, args.jobs, seed=args.seed + 1, timeout=args.timeout)
        problems += report("chaos", result, args.jobs)
        print("\n".join(["fault log:", *result["fault_log"]]))
    finally:
        platform.stop()
        if not args.keep and not problems:
            import shutil

            shutil.rmtree(data_dir, ignore_errors=True)
        else:
            print(f"logs and database kept under {data_dir}")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
