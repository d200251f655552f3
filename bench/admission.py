"""Admission figures:

1. submits per second through the whole stack under gunicorn (token auth, the rate-limit
   script, validation, the tenant lock and queued-job count, the insert and its audit event, the
   dispatch trigger on commit), beside a minimal authenticated DRF endpoint served by the same
   gunicorn in the same run (target: at least half its rate);
2. the latency of one bucket check (the Lua script, both buckets, one round trip), p50 and p99.

`python -m bench.admission [--quick]` writes docs/bench/40-admission.md. Uses the embedded
default (SQLite + bundled Redis) unless DATABASE_URL / REDIS_URL are set; each backend's latest
figures are kept in docs/bench/40-admission.json and the section shows every backend run so far
(`DATABASE_URL=postgres://.../postgres GPUPLATFORM_BENCH_DB_NAME=... python -m bench.admission`
adds or refreshes the PostgreSQL part). gunicorn runs with the Procfile's options; the submits
run twice, all clients one tenant (the worst case for its lock) and spread over several.

The gunicorn app is this module's `application`: the platform's own URLs plus `/bench/ping/`
(token auth, IsAuthenticated, returns {"ok": true}).
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import os
import pathlib
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parent.parent
OUT = ROOT / "docs" / "bench" / "40-admission.md"
FIGURES = ROOT / "docs" / "bench" / "40-admission.json"  # the latest run on each backend
BELOW_TARGET = """Below the target in this run. The rounds of one run differ by up to 0.15 on this shared
2-core machine; the notes below say where a submit's CPU goes."""
NOTES = """Where a submit's CPU goes (web process, in-process timings on the machine of the last full runs,
2026-11-30, which ran a minimal request ~1.5x slower than on earlier days): the token, user,
membership, tenant, tier, quota, template and SKU in one statement ~0.22 ms (the token and user
alone, as every API request reads them, ~0.06-0.09); the rate-limit script ~0.28 ms of wall
time with its round trip; validation ~0.08; the job and its event built and their insert
parameters ~0.14; on SQLite BEGIN IMMEDIATE, the kept count, two inserts and the commit
~0.3, most of it the commit writing the WAL's pages; the 201's position and estimate ~0.06-0.12;
the 201 itself ~0.03; the rest is Django's and DRF's request handling, the same as a minimal
request's. Under gunicorn every figure grows with the threads' contention for the GIL and the
two cores (the client's 8 threads share them).

The last changes (docs/admission.md, "What a submit costs"): the API's token check reads token
and user with one statement instead of DRF's ORM query, which was compiled for every
request (about half a minimal request's CPU), and a submit's check reads the submitter with
them (one statement fewer a submit); rows.py resolves the thread's connection once instead of
through Django's proxy for every attribute. Since issue 15 rows.py uses public APIs only: its
statements run on Django's own cursor (on SQLite they had run on sqlite3's own, ~10 us a
statement less; on PostgreSQL they were prepared on the server), and the submit is one use
case (apps/admission/submit.py) for the API and the web form. Before them, full runs
the same day gave 0.44 (0.34-0.51) and 0.46 (0.41-0.52) on SQLite; the session before ended at
SQLite 0.48 / 0.49, PostgreSQL 0.47 / 0.46 (three rounds), and the first runs gave 0.19 and 0.14.
Tried and left over the sessions: other gunicorn worker/thread mixes, a shorter GIL switch
interval, caching templates, SKUs and tiers per process (a template's version bump must miss
the result cache at once), dropping the jobs table's foreign keys, checking the cap inside the
job's INSERT on SQLite, converting only the columns that have converters when building rows."""
YARDSTICK = """
The yardstick is the minimal endpoint as DRF ships it, the same as in every run before. The
platform's API authentication (apps/tenants/auth.py: DRF's token check with its lookup one
prepared statement instead of an ORM query compiled per request, and for a submit the same
statement reading the submitter) gives the platform's own minimal endpoint ~1.4 times the
yardstick's rate for about a third less CPU; the last column puts the submits beside that one too."""
SUBMIT = {"template": "demo-train", "params": {"steps": 1}, "gpus": 1, "gpu_sku": "H100-80GB"}


# --- the gunicorn side ---------------------------------------------------------------------------


def application(environ, start_response):
    """WSGI entry: the platform, with ROOT_URLCONF pointed at this module (adds /bench/ping/)."""
    global _wsgi
    if _wsgi is None:
        os.environ.setdefault("DJANGO_SETTINGS_MODULE", "gpuplatform.settings")
        from django.conf import settings
        from django.core.wsgi import get_wsgi_application

        _wsgi = get_wsgi_application()
        settings.ROOT_URLCONF = __name__
    return _wsgi(environ, start_response)


_wsgi = None


def __getattr__(name: str):
    # Lazy so that importing this module (bench.run_all does) needs no Django settings.
    if name == "asgi_application":  # the same app behind the Procfile's ASGI router
        os.environ.setdefault("DJANGO_SETTINGS_MODULE", "gpuplatform.settings")
        from gpuplatform.asgi import build

        return build(application)
    if name == "urlpatterns":
        from django.urls import include, path
        from rest_framework.authentication import TokenAuthentication
        from rest_framework.permissions import IsAuthenticated
        from rest_framework.response import Response
        from rest_framework.views import APIView

        class OrmTokenAuthentication(TokenAuthentication):
            """DRF's token authentication as it ships (an ORM query per request), on the platform's
            hashed tokens: DRF's own Token table holds no keys since tokens are stored hashed."""

            def authenticate_credentials(self, key):
                from rest_framework.exceptions import AuthenticationFailed

                from apps.tenants.models import ApiToken
                from apps.tenants.tokens import digest_of

                token = (
                    ApiToken.objects.select_related("user").filter(digest=digest_of(key)).first()
                )
                if token is None or not token.user.is_active:
                    raise AuthenticationFailed("Invalid token.")
                return (token.user, token)

        class Ping(APIView):
            """The yardstick: DRF's own token authentication (its ORM lookup), as in every run so far."""

            authentication_classes = [OrmTokenAuthentication]
            permission_classes = [IsAuthenticated]

            def get(self, request):
                return Response({"ok": True})

        class PlatformPing(Ping):
            """The same with the platform's API authentication (apps.tenants.auth)."""

            authentication_classes = APIView.authentication_classes

        return [path("bench/ping/", Ping.as_view()), path("bench/ping-platform/", PlatformPing.as_view()),
                path("", include("gpuplatform.urls"))]  # fmt: skip
    raise AttributeError(name)


# --- the client side -----------------------------------------------------------------------------


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]


def server_cpu(pid: int) -> float:
    """CPU seconds (user + system) used so far by the gunicorn master and its workers."""
    import psutil

    processes = [psutil.Process(pid)]
    processes += processes[0].children(recursive=True)
    total = 0.0
    for process in processes:
        try:
            times = process.cpu_times()
        except psutil.Error:
            continue
        total += times.user + times.system
    return total


def hammer(
    url: str,
    tokens: list[str],
    count: int,
    threads: int,
    body: dict | None,
    server_pid: int | None = None,
) -> dict:
    """`count` requests from `threads` keep-alive clients; rate, latency, status codes and the
    server's CPU time per request (less sensitive than rates to other work on the machine)."""
    import requests

    def worker(i: int) -> list[tuple[float, int]]:
        n = shares[i]
        session = requests.Session()
        session.headers["Authorization"] = f"Token {tokens[i % len(tokens)]}"
        out = []
        for _ in range(n):
            started = time.perf_counter()
            response = (
                session.post(url, json=body, timeout=60) if body else session.get(url, timeout=60)
            )
            out.append((time.perf_counter() - started, response.status_code))
        return out

    shares = [count // threads + (1 if i < count % threads else 0) for i in range(threads)]
    cpu_before = server_cpu(server_pid) if server_pid else 0.0
    started = time.perf_counter()
    with concurrent.futures.ThreadPoolExecutor(threads) as pool:
        results = [r for part in pool.map(worker, range(threads)) for r in part]
    seconds = time.perf_counter() - started
    cpu = (server_cpu(server_pid) - cpu_before) if server_pid else 0.0
    latencies = [r[0] for r in results]
    codes: dict[int, int] = {}
    for _, code in results:
        codes[code] = codes.get(code, 0) + 1
    return {"n": count, "per_second": count / seconds, "p50_ms": statistics.median(latencies) * 1000,
            "p99_ms": percentile(latencies, 0.99) * 1000, "codes": codes, "cpu_ms": cpu / count * 1000,
            "busy": cpu / seconds, "seconds": seconds, "latencies": latencies}  # fmt: skip


def merged(parts: list[dict]) -> dict:
    """Several `hammer` runs of one kind as one: rates over their summed time, latency
    percentiles over all their requests, CPU per request over all of them."""
    n, seconds = sum(p["n"] for p in parts), sum(p["seconds"] for p in parts)
    latencies = [x for p in parts for x in p["latencies"]]
    codes: dict = {}
    for part in parts:
        for code, k in part["codes"].items():
            codes[code] = codes.get(code, 0) + k
    cpu = sum(p["cpu_ms"] * p["n"] for p in parts) / n
    return {"n": n, "per_second": n / seconds, "p50_ms": statistics.median(latencies) * 1000,
            "p99_ms": percentile(latencies, 0.99) * 1000, "codes": codes, "cpu_ms": cpu,
            "busy": cpu * n / 1000 / seconds, "seconds": seconds}  # fmt: skip


def bucket_check_latency(redis_url: str, count: int) -> dict:
    import redis

    from apps.admission import buckets

    conn = redis.Redis.from_url(redis_url)
    pair = [
        buckets.Bucket("gpuplatform:rl:bench:tenant", 1e9, 10**9),
        buckets.Bucket("gpuplatform:rl:bench:user", 1e9, 10**9),
    ]
    buckets.take(pair, conn=conn)  # load the script
    samples = []
    for _ in range(count):
        started = time.perf_counter()
        buckets.take(pair, conn=conn)
        samples.append(time.perf_counter() - started)
    pings = []  # a bare round trip to the same server, for scale (the machine's loopback)
    for _ in range(min(count, 5000)):
        started = time.perf_counter()
        conn.ping()
        pings.append(time.perf_counter() - started)
    return {
        "n": count,
        "p50_us": statistics.median(samples) * 1e6,
        "p99_us": percentile(samples, 0.99) * 1e6,
        "ping_p50_us": statistics.median(pings) * 1e6,
    }


TENANTS = 4  # the several-tenant case: one member each, the client threads spread over them
ROUNDS = 5  # interleaved rounds: the minimal endpoints, one-tenant submits, spread submits (then the minimal endpoints again)


def web_app() -> str:
    """This module's app in the Procfile's kind: WSGI, or ASGI (gpuplatform/asgi.py's router)."""
    line = next(
        row for row in (ROOT / "Procfile").read_text().splitlines() if row.startswith("web:")
    )
    return (
        "bench.admission:asgi_application"
        if "asgi" in line.split()[2]
        else "bench.admission:application"
    )


def web_options() -> list[str]:
    """The Procfile's gunicorn options (workers, threads, logging, timeout), so the bench serves
    both endpoints the way `make run` does; only the app and the bind differ."""
    line = next(
        row for row in (ROOT / "Procfile").read_text().splitlines() if row.startswith("web:")
    )
    words = line.split()[3:]  # after "web: gunicorn <app>"
    options, skip = [], False
    for word in words:
        if skip:
            skip = False
        elif word == "--bind":
            skip = True
        else:
            options.append(word)
    return options


SEED_TENANTS = """
import json
from apps.tenants.services import quota_set, tenant_create, user_create
tokens = []
for i in range(1, {n} + 1):
    tenant = tenant_create(slug=f"bench-{{i}}", tier_name="enterprise")
    quota_set(tenant=tenant, max_queued_jobs=1000000, submit_rate_per_minute=100000000, submit_burst=100000000)
    tokens.append(user_create(username=f"bench-{{i}}", tenant_slug=tenant.slug, role="member")[1])
print(json.dumps(tokens))
"""


def start_web(data_dir: pathlib.Path):
    from tests.e2e.platform import Platform

    # Its own database: a SQLite file, or (DATABASE_URL on PostgreSQL) a database of this name
    # created beside it; GPUPLATFORM_BENCH_DB_NAME keeps two benches on one server apart.
    name = os.environ.get("GPUPLATFORM_BENCH_DB_NAME", "gpuplatform_bench_admission")
    platform = Platform(data_dir, name=name, redis_db=3)
    platform.manage("migrate", "--noinput", "-v", "0")
    seed = subprocess.run([sys.executable, "-m", "tests.e2e.seed"], cwd=ROOT, env=platform.env, check=True,
                          capture_output=True, text=True)  # fmt: skip
    platform.tokens = json.loads(seed.stdout.strip().splitlines()[-1])
    platform.manage("set_quota", "acme", "--max-queued-jobs", "1000000", "--submit-rate", "100000000",
                    "--submit-burst", "100000000")  # fmt: skip
    platform.manage("shell", "-c", "from tests.factories import make_node; make_node('bench-h1')")
    out = platform.manage("shell", "-c", SEED_TENANTS.format(n=TENANTS))
    platform.tenant_tokens = json.loads(out.strip().splitlines()[-1])
    platform.spawn("web", [sys.executable, "-m", "gunicorn", web_app(), "--bind",
                           f"127.0.0.1:{platform.port}", *web_options()])  # fmt: skip
    platform.wait_until(
        lambda: _answers(platform.url + "/healthz"), timeout=60, what="gunicorn answering"
    )
    return platform


def _answers(url: str) -> bool:
    import requests

    try:
        return requests.get(url, timeout=2).status_code == 200
    except requests.RequestException:
        return False


def _bare(check: dict) -> str:
    if "ping_p50_us" not in check:
        return ""
    return (
        f"; a bare `PING` to the same server took p50 {check['ping_p50_us']:.0f} us in the same run"
    )


def render(runs: dict) -> str:
    """The section from the latest run on each backend (docs/bench/40-admission.json)."""
    parts = ["## Admission: submits per second and the bucket check\n"]
    ratios = []
    for backend in ("SQLite (embedded default)", "PostgreSQL"):
        if backend not in runs:
            continue
        run = runs[backend]
        ping, submit, spread, check = (run[k] for k in ("ping", "submit", "spread", "check"))
        ping_rate, ping_cpu = ping["per_second"], ping["cpu_ms"]
        # Each round's submits against the minimal endpoint's runs just before and after them;
        # the median over the rounds.
        rounds = run.get("ratios") or {  # a figure saved before the rounds: one ping before, one after
            kind: [run[kind]["per_second"] / ((ping_rate + run["ping_after"]["per_second"]) / 2)] for kind in ("submit", "spread")
        }  # fmt: skip
        ratio = {kind: statistics.median(rounds[kind]) for kind in ("submit", "spread")}
        ratios += list(ratio.values())

        own, own_rounds = run.get("own_ping"), run.get("own_ratios")

        def row(
            what: str, r: dict, kind: str, rounds=rounds, ratio=ratio, own_rounds=own_rounds
        ) -> str:
            each = ", ".join(f"{x:.2f}" for x in rounds[kind])
            mine = f" {statistics.median(own_rounds[kind]):.2f} |" if own_rounds else ""
            return (f"| {what}, {r['n']} requests | {r['per_second']:.0f} /s (p50 {r['p50_ms']:.0f} ms, p99 "
                    f"{r['p99_ms']:.0f} ms) | {r['cpu_ms']:.1f} ms | {ratio[kind]:.2f} ({each}) |{mine}")  # fmt: skip

        if own:
            head = "| figure | rate | server CPU per request | / minimal DRF endpoint | / same with the platform's auth |\n|---|---|---|---|---|"
            own_row = (f"| the same endpoint with the platform's API authentication (`GET /bench/ping-platform/`: "
                       f"apps.tenants.auth, one prepared statement), {own['n']} requests | {own['per_second']:.0f} req/s | "
                       f"{own['cpu_ms']:.1f} ms | {own['per_second'] / ping_rate:.2f} | 1 |\n")  # fmt: skip
            ping_tail = " |"
        else:  # a figure saved before the platform's own authentication
            head, own_row, ping_tail = (
                "| figure | rate | server CPU per request | / minimal endpoint |\n|---|---|---|---|",
                "",
                "",
            )

        parts.append(f"""### {backend}

Command: `{run["command"]}` ({backend}, Redis; gunicorn with the Procfile's options
`{" ".join(web_options())}`; {run["threads"]} keep-alive client threads on the same 2-core machine,
shared with other work: load average {run["load"]:.1f} at the start; no dispatcher or agents run, so
every admitted job stays queued).

{len(rounds["submit"])} rounds, each: the minimal endpoint{"s" if own else ""}, the submits of one tenant, the submits spread over
{TENANTS} tenants; the minimal endpoint{"s" if own else ""} once more at the end. A ratio is the median over the
rounds of each round's rate against the mean of the minimal endpoint's runs just before and
after it (each round's ratio in brackets), so drift in the machine's other load cancels.{YARDSTICK if own else ""}

{head}
| minimal authenticated DRF endpoint (`GET /bench/ping/`: DRF's own TokenAuthentication and IsAuthenticated), all its runs, {ping["n"]} requests | {ping_rate:.0f} req/s | {ping_cpu:.1f} ms | 1 |{ping_tail}
{own_row}{row("submits through the whole stack (`POST /api/v1/jobs/`: auth, rate-limit script, validation, queued-job cap on the kept count, insert + audit event, dispatch trigger), all clients one tenant (the worst case)", submit, "submit")}
{row(f"the same submits, clients spread over {TENANTS} tenants", spread, "spread")}

Status codes: submits {submit["codes"]} and {spread["codes"]}, minimal endpoint {ping["codes"]}. One
bucket check (Lua script over the tenant and user buckets, one round trip), {check["n"]} checks:
p50 {check["p50_us"]:.0f} us, p99 {check["p99_us"]:.0f} us (timed from Python: redis-py `EVALSHA`
over loopback TCP, so it includes the client's own cost{_bare(check)}).
""")
    parts.append(f"""Target: submits at least 0.5 of the minimal endpoint's rate. Server CPU per request: user +
system time of the gunicorn master and workers over the run, divided by its requests (it moves
much less than the rates with the machine's other load).

{"Target met: every ratio against the yardstick is at least 0.5." if ratios and min(ratios) >= 0.5 else BELOW_TARGET}

{NOTES}
""")
    return "\n".join(parts)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument(
        "--quick", action="store_true", help="600 requests per row, 2,000 bucket checks"
    )
    args = parser.parse_args()
    requests_n, checks_n, threads = (600, 2000, 8) if args.quick else (3000, 20000, 8)
    per_round = requests_n // ROUNDS
    os.environ.setdefault("SECRET_KEY", "bench-only")
    backend = (
        "PostgreSQL"
        if os.environ.get("DATABASE_URL", "").startswith("postgres")
        else "SQLite (embedded default)"
    )
    redis_server = None
    load = os.getloadavg()[0]
    with tempfile.TemporaryDirectory(prefix="gpuplatform-bench-admission-") as tmp:
        if not os.environ.get("REDIS_URL"):
            from gpuplatform import embedded_redis

            redis_server = embedded_redis.start(pathlib.Path(tmp) / "redis", persist=False)
            os.environ["REDIS_URL"] = redis_server.url
        platform = None
        try:
            platform = start_web(pathlib.Path(tmp))
            one, several = [platform.tokens["bob"]], platform.tenant_tokens
            pid = platform.processes["web"].pid
            ping_url, submit_url = platform.url + "/bench/ping/", platform.url + "/api/v1/jobs/"
            own_url = platform.url + "/bench/ping-platform/"
            hammer(ping_url, one, 50, threads, None)  # warm both workers
            hammer(own_url, one, 50, threads, None)
            pings, owns, submits, spreads = [], [], [], []

            def minimal() -> None:
                pings.append(hammer(ping_url, one, per_round, threads, None, pid))
                owns.append(hammer(own_url, one, per_round, threads, None, pid))

            minimal()
            for _ in range(ROUNDS):
                submits.append(hammer(submit_url, one, per_round, threads, SUBMIT, pid))
                spreads.append(hammer(submit_url, several, per_round, threads, SUBMIT, pid))
                minimal()
            os.environ.setdefault("DJANGO_SETTINGS_MODULE", "gpuplatform.settings")
            import django

            django.setup()
            check = bucket_check_latency(platform.env["REDIS_URL"], checks_n)
        finally:
            if platform is not None:
                platform.stop()
            if redis_server:
                redis_server.stop()

    def against(minimal_runs: list[dict]) -> dict:
        return {kind: [run["per_second"] / ((minimal_runs[i]["per_second"] + minimal_runs[i + 1]["per_second"]) / 2)
                       for i, run in enumerate(runs_of)] for kind, runs_of in (("submit", submits), ("spread", spreads))}  # fmt: skip

    # A yardstick that answers 401 (or a submit that is refused) measures the wrong path.
    for runs_of, want in ((pings, 200), (owns, 200), (submits, 201), (spreads, 201)):
        codes = {code for run in runs_of for code in run["codes"]}
        if codes != {want}:
            raise SystemExit(f"bench.admission: expected only {want} answers, got {sorted(codes)}")
    ratios, own_ratios = against(pings), against(owns)
    ping, own, submit, spread = merged(pings), merged(owns), merged(submits), merged(spreads)
    print(f"ping {ping}\nping, platform auth {own}\nsubmit one tenant {submit}\nsubmit {TENANTS} tenants {spread}\n"
          f"ratios {ratios}\nagainst the platform-auth ping {own_ratios}\nbucket check {check}", flush=True)  # fmt: skip
    command = "python -m bench.admission" + (" --quick" if args.quick else "")
    if backend == "PostgreSQL":
        command = "DATABASE_URL=postgres://... " + command
    runs = json.loads(FIGURES.read_text()) if FIGURES.exists() else {}
    runs[backend] = {"command": command, "load": load, "threads": threads, "ping": ping, "submit": submit,
                     "spread": spread, "ratios": ratios, "check": check, "own_ping": own,
                     "own_ratios": own_ratios}  # fmt: skip
    FIGURES.parent.mkdir(parents=True, exist_ok=True)
    FIGURES.write_text(json.dumps(runs, indent=1, sort_keys=True) + "\n")
    OUT.write_text(render(runs))
    return 0


if __name__ == "__main__":
    sys.exit(main())
