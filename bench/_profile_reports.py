"""Profile the web's share of a drain in one process: the agents' batched reports
(`POST /internal/agent/v1/reports/`, a "started" and a "finished" report per job) through
Django's test client (the whole middleware stack, DRF, the report services, the database and
Redis), under cProfile.

    python -m bench._profile_reports [--rounds 40] [--per-call 4] [--paired] [--top 40]
                                     [--sort tottime] [--cpu]

4 nodes x 4 GPUs; each round submits 16 one-GPU jobs, places them (a dispatcher pass, not
measured) and each node then posts its members' starts, `--per-call` members to a call, and then
their ends the same way (4: a node's all at once; 1: each report alone). `--paired`: each call
carries its members' starts and their ends together, as a drain's calls mostly do since the
agents send a quick job's end behind its start (workers/reporter.py; `--per-call 1 --paired`:
one job's start and end a call). A fresh SQLite file (or a fresh PostgreSQL database beside
DATABASE_URL's) and an embedded Redis; the e2e cast (tests/e2e/seed.py). Prints the CPU and the
SQL statements per job (its two reports), the statements of one call by their first words, and
cProfile's top rows. Not part of `make bench` (a tool for finding the cost, not a figure).
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import sys
import time

from bench._in_process import django_in_process

NODES, GPUS = 4, 4
API = "/internal/agent/v1"


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=40)
    parser.add_argument("--per-call", type=int, default=GPUS)
    parser.add_argument("--paired", action="store_true",
                        help="each call carries its members' starts and ends together")  # fmt: skip
    parser.add_argument("--top", type=int, default=40)
    parser.add_argument("--sort", default="tottime")
    parser.add_argument(
        "--cpu", action="store_true",
        help="profile with the process's CPU clock (time.process_time) instead of the wall's: "
        "a round trip's wait on the database then counts for nothing",
    )  # fmt: skip
    parser.add_argument(
        "--sql", action="store_true", help="print the first call's statements whole"
    )
    args = parser.parse_args()
    with django_in_process() as token:
        run(token, args)
    return 0


def run(token: str, args) -> None:
    from django.core.management import call_command
    from django.db import connection
    from django.test import Client

    from apps.jobs.models import AttemptMember
    from apps.nodes.credentials import issue_credential
    from apps.scheduling.dispatcher import dispatch_once
    from bench._profile_submit import database_server_cpu
    from tests.factories import make_node

    call_command("set_quota", "acme", "--max-queued-jobs", "100000",
                 "--submit-rate", "1000000", "--submit-burst", "100000")  # fmt: skip
    submitter = Client(HTTP_AUTHORIZATION=f"Token {token}")
    agents = {}
    for i in range(NODES):
        name = f"peer-{i}"
        make_node(name, gpus=GPUS)
        agents[name] = Client(HTTP_AUTHORIZATION=f"Bearer {issue_credential(node_name=name)[1]}")

    def place() -> dict[str, list]:
        for _ in range(NODES * GPUS):
            answer = submitter.post("/api/v1/jobs/", {"command": ["true"], "gpus": 1},
                                    content_type="application/json")  # fmt: skip
            assert answer.status_code == 201, answer.content
        dispatch_once()
        members = AttemptMember.objects.filter(ended_at=None).select_related("attempt", "node")
        placed: dict[str, list] = {name: [] for name in agents}
        for m in members:
            placed[m.node.name].append({"attempt_id": m.attempt_id, "rank": m.rank,
                                        "token": str(m.attempt.token)})  # fmt: skip
        assert sum(map(len, placed.values())) == NODES * GPUS, placed
        return placed

    started, finished = ({"kind": "started", "pid": 7}, {"kind": "finished", "exit_code": 0})

    def calls(placed: dict[str, list]) -> list[tuple[str, list]]:
        """(node, its call's reports), in the order sent."""
        step, out = args.per_call, []
        for name, members in placed.items():
            chunks = [members[i : i + step] for i in range(0, len(members), step)]
            if args.paired:
                out += [
                    (name, [{**m, **b} for b in (started, finished) for m in c]) for c in chunks
                ]
            else:
                out += [
                    (name, [{**m, **b} for m in c]) for b in (started, finished) for c in chunks
                ]
        return out

    def report(placed: dict[str, list]) -> None:
        for name, reports in calls(placed):
            answer = agents[name].post(f"{API}/reports/", {"reports": reports},
                                       content_type="application/json")  # fmt: skip
            results = answer.json()["results"]
            assert all(r.get("accepted") for r in results), results

    server_cpu = [0.0]  # the PostgreSQL backend's, during the calls (None on SQLite)

    def measure(rounds: int, profile: cProfile.Profile | None) -> float:
        cpu, server_cpu[0] = 0.0, 0.0
        for _ in range(rounds):
            placed = place()
            server = database_server_cpu()
            began = time.process_time()
            if profile:
                profile.enable()
            report(placed)
            if profile:
                profile.disable()
            cpu += time.process_time() - began
            if server is not None:
                server_cpu[0] += database_server_cpu() - server
        server_cpu[0] = server_cpu[0] / (rounds * NODES * GPUS) * 1000
        return cpu / (rounds * NODES * GPUS) * 1000

    def statements() -> None:
        """The SQL of one round's calls: per job, and the first call's by their first words."""
        from collections import Counter

        from django.test.utils import CaptureQueriesContext

        placed = place()
        sent = calls(placed)
        with CaptureQueriesContext(connection) as first:
            name, reports = sent[0]
            agents[name].post(f"{API}/reports/", {"reports": reports},
                              content_type="application/json")  # fmt: skip
        with CaptureQueriesContext(connection) as rest:
            for name, reports in sent[1:]:
                agents[name].post(f"{API}/reports/", {"reports": reports},
                                  content_type="application/json")  # fmt: skip
        total = len(first.captured_queries) + len(rest.captured_queries)
        print(
            f"statements a job: {total / (NODES * GPUS):.2f}; one call of {len(sent[0][1])} "
            f"reports: {len(first.captured_queries)}"
        )
        heads = Counter(" ".join(q["sql"].split()[:3])[:60] for q in first.captured_queries)
        for head, n in heads.most_common():
            print(f"  {n:3d}  {head}")
        if args.sql:
            for q in first.captured_queries:
                print(f"    {q['sql']}")

    measure(3, None)  # warm: imports, the process's caches
    statements()
    print(f"unprofiled: {measure(args.rounds, None):.2f} ms CPU a job (its two reports)")
    if connection.vendor == "postgresql":
        print(f"the PostgreSQL backend serving them: {server_cpu[0]:.2f} ms CPU a job")
    profile = cProfile.Profile(time.process_time) if args.cpu else cProfile.Profile()
    print(f"profiled: {measure(args.rounds, profile):.2f} ms CPU a job")
    pstats.Stats(profile).sort_stats(args.sort).print_stats(args.top)


if __name__ == "__main__":
    sys.exit(main())
