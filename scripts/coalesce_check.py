"""`python -m scripts.coalesce_check --runs 50`: ten identical cacheable submits at once, on the
whole platform, again and again; each run must give one execution and no 5xx (issue 36).

A platform of its own (gunicorn with 2 workers x 4 threads, the dispatcher with its beat, one
fake 8-GPU node agent, its own embedded Redis, a fresh database beside DATABASE_URL's) takes,
in every run, ten `demo-infer` submits of one tenant with one body (a body no earlier run sent,
so each run starts with an empty cache), released together from a barrier. Then every job must
end `succeeded`, the ten together must have had exactly one attempt (one origin ran; the nine
others were its followers or hits), and no answer may be a 5xx. Prints a line per run and the
count of runs in a row that held; stops at the first run that did not (exit status 1), with the
answers and the web's log lines about it. PostgreSQL is the point (DATABASE_URL); on SQLite it
runs too, where one writer makes it trivially hold.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import os
import pathlib
import sys
import tempfile
import threading
import time
import uuid

ROOT = pathlib.Path(__file__).resolve().parent.parent
SUBMITTERS = 10
TERMINAL = {"succeeded", "failed", "cancelled"}


def start_platform(data_dir: pathlib.Path):
    os.environ.setdefault("SECRET_KEY", "coalesce-check-only-not-a-secret")
    sys.path.insert(0, str(ROOT))
    from tests.e2e.platform import Platform

    platform = Platform(data_dir, name="coalesce_check", own_redis=True)
    platform.start({"coalesce-1": ("H100-80GB", 8, "")})
    platform.manage("set_quota", "acme", "--submit-rate", "100000", "--submit-burst", "100000",
                    "--max-queued-jobs", "100000")  # fmt: skip
    return platform


def one_run(platform, number: int, nonce: str) -> tuple[bool, str]:
    """Ten identical submits at once; (held, what happened)."""
    body = {"template": "demo-infer", "gpus": 1, "gpu_sku": "H100-80GB",
            "params": {"prompt": f"coalesce {nonce} run {number}", "max_tokens": 4}}  # fmt: skip
    barrier = threading.Barrier(SUBMITTERS)

    def submit(_):
        session = platform.api("bob")
        session.get(platform.url + "/healthz", timeout=30)  # connected before the barrier
        barrier.wait(30)
        response = session.post(platform.url + "/api/v1/jobs/", json=body, timeout=120)
        return response.status_code, response.text

    with concurrent.futures.ThreadPoolExecutor(SUBMITTERS) as pool:
        answers = list(pool.map(submit, range(SUBMITTERS)))
    codes = [code for code, _ in answers]
    if any(code != 201 for code in codes):
        bad = [text[:300] for code, text in answers if code != 201]
        return False, f"answers {sorted(codes)}: {bad}"
    import json

    ids = [json.loads(text)["id"] for _, text in answers]
    jobs = [platform.wait_for_state(job_id, TERMINAL, timeout=120) for job_id in ids]
    states = sorted(job["state"] for job in jobs)
    attempts = sum(len(job["attempts"]) for job in jobs)
    hits = sum(1 for job in jobs if job.get("cache_hit"))
    what = f"{len(set(ids))} jobs, {attempts} execution(s), {hits} cache hits, states {set(states)}"
    return states == ["succeeded"] * SUBMITTERS and attempts == 1 and len(set(ids)) == 10, what


def web_errors(platform) -> list[str]:
    path = platform.data_dir / "web.log"
    text = path.read_text(errors="replace") if path.exists() else ""
    marks = ("Internal Server Error", "Traceback", "deadlock detected", "could not serialize",
             "DETAIL:", "Process ", "CONTEXT:", "while locking", "SQL statement")  # fmt: skip
    # A transaction PostgreSQL aborted and that ran again (apps/platform/retry.py) answered
    # 201 all the same: its INFO line is counted below, not an error.
    return [line for line in text.splitlines()
            if any(mark in line for mark in marks) and "running it again" not in line]  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=50)
    parser.add_argument(
        "--keep-going",
        action="store_true",
        help="run every run and count the failures, instead of stopping at the first",
    )
    args = parser.parse_args(argv)
    if not os.environ.get("DATABASE_URL", "").startswith(("postgres://", "postgresql://")):
        print("note: DATABASE_URL names no PostgreSQL server: this runs on SQLite (one writer)")
    nonce = uuid.uuid4().hex[:8]
    with tempfile.TemporaryDirectory(prefix="coalesce-check-") as tmp:
        platform = start_platform(pathlib.Path(tmp))
        try:
            held, failed, seen = 0, 0, 0
            for number in range(1, args.runs + 1):
                started = time.monotonic()
                ok, what = one_run(platform, number, nonce)
                errors = web_errors(platform)[seen:]
                seen += len(errors)
                ok = ok and not errors
                print(f"run {number}: {'ok' if ok else 'FAILED'}: {what} ({time.monotonic() - started:.1f}s)",
                      flush=True)  # fmt: skip
                if ok:
                    held += 0 if failed else 1
                    continue
                print("\n".join(["the web's log:", *errors[-40:]]) if errors else "", flush=True)
                failed += 1
                if not args.keep_going:
                    print(f"{held} of {args.runs} runs in a row held before run {number} failed")
                    return 1
            log = (platform.data_dir / "web.log").read_text(errors="replace")
            print(f"transactions aborted by PostgreSQL and run again: {log.count('running it again')} "
                  "(apps/platform/retry.py)")  # fmt: skip
            if failed:
                print(
                    f"{failed} of {args.runs} runs failed ({held} in a row held before the first)"
                )
                return 1
            print(f"{held} of {args.runs} runs in a row: one execution, no 5xx")
            return 0
        finally:
            platform.stop()


if __name__ == "__main__":
    sys.exit(main())
