"""The concurrency stress suite's harness (issue 36; docs/reliability.md, "Concurrency").

One run, from one seed, against PostgreSQL: WORKERS threads each play a schedule of OPS
operations drawn from the seed, through the same doors production uses (the jobs API for
submits and cancels, in process through Django's test client; the agent API's batch reports
for starts, finishes and preemption ends; the services the dispatcher's policy calls to
preempt), while a dispatcher thread runs passes, a reconcile thread runs ticks, and a monitor
thread samples the database. Then everything still running is finished (the drain), and the
invariants are read from the database. The seed fixes each thread's schedule (operations,
bodies, pauses, choices among what exists); the interleaving is the operating system's, so a
seed replays its schedule, and a failure found once shows again within a few replays.

Every failure leaves its evidence in a file (`evidence`), named in the failure: the broken
invariants, every unexpected answer and error with its traceback, the lock waits the monitor
saw (pg_stat_activity with pg_blocking_pids), and the PostgreSQL server log's lines for this
database during the run (log_lock_waits on, deadlock_timeout 20 ms: tests/concurrency/conftest.py).
"""

from __future__ import annotations

import glob
import logging
import os
import pathlib
import random
import threading
import time
import traceback
from collections import Counter, defaultdict
from dataclasses import dataclass, field

import pytest
from django.db import connection, connections
from django.utils import timezone

from apps.admission import queued
from apps.admission.models import CachedJob, CacheRole, IdempotencyKey
from apps.jobs.models import (
    ATTEMPT_ACTIVE,
    ATTEMPT_TERMINAL,
    JOB_ACTIVE,
    AttemptMember,
    DependencyState,
    GpuAllocation,
    Job,
    JobArray,
    JobDependency,
    JobEvent,
    JobState,
)
from apps.jobs.services import job_preempt
from apps.nodes.credentials import issue_credential
from apps.platform import events
from apps.platform.errors import ServiceError
from apps.scheduling.dispatcher import dispatch_once
from apps.scheduling.reconcile import reconcile_once
from apps.tenants.models import Tenant
from apps.tenants.services import quota_set
from tests.factories import client_for, make_cast, make_node

ROOT = pathlib.Path(__file__).resolve().parents[2]
ON_POSTGRESQL = pytest.mark.skipif(
    connection.vendor != "postgresql",
    reason="needs PostgreSQL: SQLite runs one writer at a time, so the interleavings of "
    "concurrent transactions this suite makes cannot happen there",
)
SEED_ENV = "GPUPLATFORM_STRESS_SEED"
WORKERS = 4
OPS = 28  # per worker
CAP = 10  # acme's queued-job cap: a hot tenant, often at its cap
NODES = {"s1": 4, "s2": 4}
PROMPTS = ("alpha", "beta", "gamma")  # three cache keys per tenant: identical submits collide
KEYS = 5  # Idempotency-Keys per tenant
USERS = {"acme": ("bob", "alice"), "globex": ("dave",)}
CANCELLER = {"acme": "alice", "globex": "dave"}  # acme's admin; dave's own jobs
DRAIN_S = 60.0
API = "/internal/agent/v1"

INVARIANTS = (
    "no 5xx, and no unhandled error in any log",
    "one execution per coalesced group",
    "the queued-job caps exact, never over",
    "one job per idempotency key",
    "every dependent either released or failed, never stuck",
    "every array's end recorded once",
    "no GPU held by two attempts",
)


def seeds() -> list[int]:
    """GPUPLATFORM_STRESS_SEED=7 (or "7,12"): those seeds only, to replay a failure. Otherwise
    GPUPLATFORM_STRESS_RUNS seeds (default 20) from GPUPLATFORM_STRESS_BASE (default 1)."""
    chosen = os.environ.get(SEED_ENV, "").replace(",", " ").split()
    if chosen:
        return [int(seed) for seed in chosen]
    runs = int(os.environ.get("GPUPLATFORM_STRESS_RUNS", "20"))
    base = int(os.environ.get("GPUPLATFORM_STRESS_BASE", "1"))
    return list(range(base, base + runs))


def evidence_dir() -> pathlib.Path:
    return pathlib.Path(os.environ.get("GPUPLATFORM_STRESS_EVIDENCE", ROOT / "var" / "concurrency"))


def infer(prompt: str) -> dict:
    return {"template": "demo-infer", "params": {"prompt": prompt, "max_tokens": 4}, "gpus": 1,
            "gpu_sku": "H100-80GB"}  # fmt: skip


def train(steps: int) -> dict:
    return {"template": "demo-train", "params": {"steps": steps}, "gpus": 1, "gpu_sku": "H100-80GB"}


def keyed_body(key: str) -> dict:
    """A key's one body (the same request sent again); `conflict` sends another."""
    return infer(PROMPTS[sum(map(ord, key)) % len(PROMPTS)])


class _Errors(logging.Handler):
    """Every ERROR (and worse) any logger emits while the run is on, from any thread; and the
    transactions PostgreSQL aborted that ran again (apps/platform/retry.py), counted."""

    def __init__(self, run: Run):
        super().__init__(level=logging.INFO)
        self.run = run

    def emit(self, record: logging.LogRecord) -> None:
        if record.name == "apps.platform.retry":
            with self.run.lock:
                self.run.retried[record.getMessage().split(":")[0]] += 1
        if record.levelno < logging.ERROR:
            return
        text = f"log {record.name} {record.levelname}: {record.getMessage()}"
        if record.exc_info:
            text += "\n" + "".join(traceback.format_exception(*record.exc_info))
        self.run.problem(text)


@dataclass
class Run:
    seed: int
    lock: threading.Lock = field(default_factory=threading.Lock)
    problems: list[str] = field(default_factory=list)
    jobs: dict[str, list[str]] = field(default_factory=lambda: {"acme": [], "globex": []})
    arrays: dict[str, list[str]] = field(default_factory=lambda: {"acme": [], "globex": []})
    by_key: dict[str, set] = field(default_factory=lambda: defaultdict(set))  # answers per key
    violations: list[str] = field(default_factory=list)  # what the monitor saw
    waits: list[str] = field(default_factory=list)  # lock waits the monitor saw
    array_ends: Counter = field(default_factory=Counter)  # committed ArrayEnded per array
    answers: Counter = field(default_factory=Counter)  # (operation, status)
    retried: Counter = field(default_factory=Counter)  # aborted transactions run again, by service
    stop: threading.Event = field(default_factory=threading.Event)
    tokens: dict[str, str] = field(default_factory=dict)
    credentials: dict[str, str] = field(default_factory=dict)
    log_at: tuple[str, int] | None = None  # the server log and its size at the start
    drained: bool = False
    seconds: dict[str, float] = field(default_factory=dict)
    server_settings: str = ""

    # --- bookkeeping ---------------------------------------------------------------------------

    def problem(self, text: str) -> None:
        with self.lock:
            self.problems.append(text)

    def known(self, kind: dict, tenant: str, item: str) -> None:
        with self.lock:
            kind[tenant].append(item)

    def pick(self, rng: random.Random, kind: dict, tenant: str) -> str | None:
        with self.lock:
            found = list(kind[tenant])
        return rng.choice(found) if found else None

    # --- set-up ------------------------------------------------------------------------------

    def setup(self) -> None:
        people = make_cast()
        for name, gpus in NODES.items():
            make_node(name, gpus=gpus)
            self.credentials[name] = issue_credential(node_name=name)[1]
        self.tokens = {name: people[name][1] for name in ("alice", "bob", "dave")}
        generous = {"submit_rate_per_minute": 100_000, "submit_burst": 100_000}
        quota_set(tenant=Tenant.objects.get(slug="acme"), max_queued_jobs=CAP, **generous)
        quota_set(tenant=Tenant.objects.get(slug="globex"), max_queued_jobs=10_000, **generous)
        self.tenant_ids = {t.slug: t.pk for t in Tenant.objects.all()}
        self.log_at = _server_log_start()
        with connection.cursor() as cursor:  # conftest's per-session settings, where allowed
            cursor.execute(
                "SELECT current_setting('log_lock_waits'), current_setting('deadlock_timeout')"
            )
            waits, timeout = cursor.fetchone()
        self.server_settings = f"log_lock_waits={waits}, deadlock_timeout={timeout}"

    def user(self, name: str):
        client = client_for(self.tokens[name])
        client.raise_request_exception = False  # a view's exception is a 500 answer, counted
        return client

    def agent(self, node: str):
        client = client_for(None)
        client.credentials(HTTP_AUTHORIZATION=f"Bearer {self.credentials[node]}")
        client.raise_request_exception = False
        return client

    # --- the run ------------------------------------------------------------------------------

    def play(self) -> None:
        """The seeded schedules, with the dispatcher, the reconcile tick and the monitor beside
        them; then the drain."""
        errors = _Errors(self)
        logging.getLogger().addHandler(errors)
        retries = logging.getLogger("apps.platform.retry")
        level, retries.level = retries.level, logging.INFO  # counted whatever LOG_LEVEL says
        events.subscribe(events.ArrayEnded, self._array_ended)  # after commit: committed ends
        started = time.monotonic()
        try:
            loops = [
                threading.Thread(target=self._loop, args=(name, step, pause), name=name)
                for name, step, pause in (
                    ("dispatcher", dispatch_once, 0.02),
                    ("reconcile", reconcile_once, 0.1),
                    ("monitor", self.sample, 0.03),
                )
            ]
            workers = [
                threading.Thread(target=self._worker, args=(i,), name=f"worker-{i}")
                for i in range(WORKERS)
            ]
            for thread in loops + workers:
                thread.start()
            for thread in workers:
                thread.join()
            self.stop.set()
            for thread in loops:
                thread.join()
            self.seconds["chaos"] = time.monotonic() - started
            self.drained = self.drain()
            self.seconds["drain"] = time.monotonic() - started - self.seconds["chaos"]
        finally:
            events.unsubscribe(events.ArrayEnded, self._array_ended)
            logging.getLogger().removeHandler(errors)
            retries.setLevel(level)

    def _array_ended(self, event: events.ArrayEnded) -> None:
        with self.lock:
            self.array_ends[str(event.array_id)] += 1

    def _loop(self, name: str, step, pause: float) -> None:
        try:
            while not self.stop.is_set():
                try:
                    step()
                except Exception:
                    self.problem(f"{name}: unhandled\n{traceback.format_exc()}")
                time.sleep(pause)
        finally:
            connections.close_all()

    def _worker(self, index: int) -> None:
        rng = random.Random(f"{self.seed}:{index}")
        users = {name: self.user(name) for name in self.tokens}
        agents = {node: self.agent(node) for node in NODES}
        names = [name for name, _ in OPERATIONS]
        weights = [weight for _, weight in OPERATIONS]
        try:
            for _ in range(OPS):
                operation = rng.choices(names, weights)[0]
                try:
                    getattr(self, operation)(rng, users, agents)
                except Exception:
                    self.problem(
                        f"worker {index}, {operation}: unhandled\n{traceback.format_exc()}"
                    )
                time.sleep(rng.uniform(0, 0.01))
        finally:
            connections.close_all()

    # --- the operations -------------------------------------------------------------------------

    def _tenant(self, rng: random.Random) -> str:
        return "acme" if rng.random() < 0.7 else "globex"

    def _submit(self, operation: str, client, body: dict, expected=(201, 429), key=None):
        headers = {"HTTP_IDEMPOTENCY_KEY": key} if key else {}
        response = client.post("/api/v1/jobs/", body, format="json", **headers)
        self._answered(operation, response, expected)
        return response.json() if response.status_code in (200, 201) else None

    def _answered(self, operation: str, response, expected) -> None:
        with self.lock:
            self.answers[(operation, response.status_code)] += 1
        if response.status_code not in expected:
            body = response.content[:600].decode(errors="replace")
            self.problem(f"{operation}: answered {response.status_code}: {body}")

    def identical(self, rng, users, agents) -> None:
        """A cacheable submit that others send too: a hit, a follower or an origin."""
        tenant = self._tenant(rng)
        made = self._submit(
            "identical", users[rng.choice(USERS[tenant])], infer(rng.choice(PROMPTS))
        )
        if made:
            self.known(self.jobs, tenant, made["id"])

    def keyed(self, rng, users, agents) -> None:
        """A submit with an Idempotency-Key: the first makes the job, the rest replay it."""
        tenant = self._tenant(rng)
        key = f"stress-{tenant}-{rng.randrange(KEYS)}"
        body = keyed_body(key)
        made = self._submit("keyed", users[USERS[tenant][0]], body, (200, 201, 429), key=key)
        if made:
            with self.lock:
                self.by_key[f"{tenant}:{key}"].add(made["id"])
            self.known(self.jobs, tenant, made["id"])

    def conflict(self, rng, users, agents) -> None:
        """A key that made a job, sent again with another body: 409, never a second job."""
        tenant = self._tenant(rng)
        with self.lock:
            used = sorted(name for name in self.by_key if name.startswith(f"{tenant}:"))
        if used:
            key = rng.choice(used).split(":", 1)[1]
            self._submit(
                "conflict", users[USERS[tenant][0]], train(rng.randrange(1, 1000)), (409,), key=key
            )

    def plain(self, rng, users, agents) -> None:
        tenant = self._tenant(rng)
        made = self._submit(
            "plain", users[rng.choice(USERS[tenant])], train(rng.randrange(1, 100_000))
        )
        if made:
            self.known(self.jobs, tenant, made["id"])

    def array(self, rng, users, agents) -> None:
        tenant = self._tenant(rng)
        spec = rng.choice(["0-3", "0-3%2", "0-1"])
        body = {**train(rng.randrange(1, 100_000)), "array": spec}
        made = self._submit("array", users[rng.choice(USERS[tenant])], body)
        if made:
            self.known(self.arrays, tenant, made["id"])

    def dependent(self, rng, users, agents) -> None:
        """A job or an array after one or two parents (jobs or arrays, the same tenant's)."""
        tenant = self._tenant(rng)
        as_array = rng.random() < 0.3
        wanted = []
        for _ in range(rng.choice((1, 1, 2))):
            if rng.random() < 0.35 and (parent := self.pick(rng, self.arrays, tenant)):
                conditions = ["afterok", "afterany", "afternotok"] + (["aftercorr"] * as_array)
                wanted.append({"array": parent, "condition": rng.choice(conditions)})
            elif parent := self.pick(rng, self.jobs, tenant):
                wanted.append(
                    {"job": parent, "condition": rng.choice(["afterok", "afterany", "afternotok"])}
                )
        if not wanted:
            return
        body = {**train(rng.randrange(1, 100_000)), "depends_on": wanted}
        if as_array:
            body["array"] = "0-1"  # every array has indices 0 and 1: aftercorr always fits
        made = self._submit("dependent", users[rng.choice(USERS[tenant])], body)
        if made:
            self.known(self.arrays if as_array else self.jobs, tenant, made["id"])

    def cancel(self, rng, users, agents) -> None:
        tenant = self._tenant(rng)
        job = self.pick(rng, self.jobs, tenant)
        if job:
            response = users[CANCELLER[tenant]].post(f"/api/v1/jobs/{job}/cancel/")
            self._answered("cancel", response, (200, 400))

    def cancel_array(self, rng, users, agents) -> None:
        tenant = self._tenant(rng)
        array = self.pick(rng, self.arrays, tenant)
        if array:
            response = users[CANCELLER[tenant]].post(f"/api/v1/arrays/{array}/cancel/")
            self._answered("cancel_array", response, (200, 400))

    def report(self, rng, users, agents) -> None:
        """An agent's batch: some of its members start, finish (0 or 1), or end after a stop
        (a preemption's or a cancel's end)."""
        node = rng.choice(sorted(NODES))
        items = []
        for member in _open_members(node):
            if rng.random() < 0.4:
                continue
            items += _reports_for(member, rng)
        if items:
            self._post_reports(agents[node], items)

    def preempt(self, rng, users, agents) -> None:
        """What the dispatcher's policy does to a victim: globex's only (acme's queue is capped,
        and a requeue is not an admission)."""
        placed = list(
            Job.objects.filter(tenant__slug="globex", state__in=(JobState.STARTING, JobState.RUNNING))
            .order_by("pk").values_list("pk", flat=True)[:20]
        )  # fmt: skip
        if placed:
            try:
                job_preempt(job=Job(pk=rng.choice(placed)), actor="system:stress", reason="stress")
            except ServiceError:
                pass  # it moved on meanwhile

    def _post_reports(self, client, items: list[dict]) -> None:
        response = client.post(f"{API}/reports/", {"reports": items}, format="json")
        self._answered("reports", response, (200,))
        if response.status_code == 200:
            for item, result in zip(items, response.json()["results"], strict=True):
                if result.get("status") != 200:
                    self.problem(f"report {item['kind']} of attempt {item['attempt_id']}: {result}")

    # --- the monitor ----------------------------------------------------------------------------

    def sample(self) -> None:
        """What must hold at every moment, read in one statement each: acme's queue within its
        cap (plus any of its jobs requeued, which no admission checks), one active origin per
        cache key; and who waits for whose lock."""
        with connection.cursor() as cursor:
            cursor.execute(CAP_SQL, [self.tenant_ids["acme"]] * 3)
            total, requeued = cursor.fetchone()
            if total > CAP + requeued:
                self.violation(
                    f"acme's queue at {total}, over its cap of {CAP} (+{requeued} requeued)"
                )
            cursor.execute(ORIGINS_SQL)
            for tenant, key, n in cursor.fetchall():
                self.violation(f"{n} active origins at once for tenant {tenant}'s key {key[:12]}")
            cursor.execute(WAITS_SQL)
            waits = cursor.fetchall()
        if waits:
            moment = timezone.now().isoformat()
            with self.lock:
                self.waits.extend(f"{moment} {row}" for row in waits)
                del self.waits[:-200]

    def violation(self, text: str) -> None:
        with self.lock:
            if text not in self.violations:
                self.violations.append(text)

    # --- the drain ------------------------------------------------------------------------------

    def drain(self) -> bool:
        """Place and finish everything until nothing is active (True), or DRAIN_S passed."""
        agents = {node: self.agent(node) for node in NODES}
        rng = random.Random(self.seed)
        deadline = time.monotonic() + DRAIN_S
        while time.monotonic() < deadline:
            for step in (dispatch_once, reconcile_once):
                try:
                    step()
                except Exception:
                    self.problem(f"drain, {step.__name__}: unhandled\n{traceback.format_exc()}")
            for node in NODES:
                items = [i for m in _open_members(node) for i in _reports_for(m, rng, finish=True)]
                if items:
                    self._post_reports(agents[node], items)
            if not _anything_active():
                return True
        return False

    # --- the invariants -----------------------------------------------------------------------

    def check(self) -> dict[str, list[str]]:
        """{invariant: what breaks it} for each broken one (empty: all hold)."""
        found = {
            INVARIANTS[0]: list(self.problems),
            INVARIANTS[1]: one_execution_per_group()
            + [v for v in self.violations if "origin" in v],
            INVARIANTS[2]: caps_exact() + [v for v in self.violations if "cap" in v],
            INVARIANTS[3]: one_job_per_key(self.by_key),
            INVARIANTS[4]: ([] if self.drained else stuck()) + dependents_settled(),
            INVARIANTS[5]: arrays_ended_once(self.array_ends),
            INVARIANTS[6]: gpus_held_once(),
        }
        return {name: broken for name, broken in found.items() if broken}

    def evidence_path(self) -> pathlib.Path:
        return evidence_dir() / f"stress-seed-{self.seed}.txt"

    def forget_evidence(self) -> None:
        self.evidence_path().unlink(missing_ok=True)

    def evidence(self, broken: dict[str, list[str]]) -> pathlib.Path:
        """The failure's evidence, in a file the failing run leaves behind (a CI artifact)."""
        path = self.evidence_path()
        path.parent.mkdir(parents=True, exist_ok=True)
        lines = [f"concurrency stress run, seed {self.seed} (replay: {SEED_ENV}={self.seed} "
                 "python -m pytest tests/concurrency)", f"seconds: {self.seconds}",
                 f"server: {self.server_settings} (conftest sets on and 20ms where the role may)",
                 f"answers: {dict(self.answers)}", f"aborted and run again: {dict(self.retried)}",
                 ""]  # fmt: skip
        for name, items in broken.items():
            lines += [f"== broken: {name} ({len(items)})", *items[:100], ""]
        lines += ["== lock waits seen (pg_stat_activity, pg_blocking_pids)", *self.waits, ""]
        lines += [
            "== the PostgreSQL server log, this database, during the run",
            *_server_log(self.log_at),
        ]
        path.write_text("\n".join(lines) + "\n")
        return path


# The cap, in one snapshot: acme's queued rows, its arrays' virtual tasks, and how many of its
# jobs went back to the queue (from a state, not submitted).
CAP_SQL = (
    "SELECT (SELECT COUNT(*) FROM jobs_job WHERE tenant_id = %s AND state = 'queued') "
    "+ (SELECT COALESCE(SUM(size - materialised), 0) FROM jobs_jobarray WHERE tenant_id = %s "
    "AND cancelled_at IS NULL AND failed_reason = '' AND materialised < size), "
    "(SELECT COUNT(*) FROM jobs_jobevent e JOIN jobs_job j ON j.id = e.job_id WHERE j.tenant_id = %s "
    "AND e.to_state = 'queued' AND e.from_state <> '')"
)
ORIGINS_SQL = (
    "SELECT c.tenant_id, c.key, COUNT(*) FROM admission_cachedjob c JOIN jobs_job j ON j.id = c.job_id "
    "WHERE c.role = 'origin' AND j.state IN ('queued', 'starting', 'running', 'preempting') "
    "GROUP BY c.tenant_id, c.key HAVING COUNT(*) > 1"
)
WAITS_SQL = (
    "SELECT pid, pg_blocking_pids(pid), wait_event, now() - query_start, left(query, 160) "
    "FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock'"
)

OPERATIONS = [("identical", 25), ("keyed", 10), ("conflict", 3), ("plain", 8), ("array", 6),
              ("dependent", 12), ("cancel", 10), ("cancel_array", 3), ("report", 18),
              ("preempt", 5)]  # fmt: skip


def _open_members(node: str) -> list[tuple]:
    return list(
        AttemptMember.objects.filter(
            node__name=node, ended_at=None, attempt__state__in=ATTEMPT_ACTIVE
        )
        .order_by("attempt_id", "rank")
        .values_list("attempt_id", "rank", "attempt__token", "started_at", "attempt__stop_requested")
    )  # fmt: skip


def _reports_for(member: tuple, rng: random.Random, *, finish: bool = False) -> list[dict]:
    attempt_id, rank, token, started_at, stop = member
    head = {"attempt_id": attempt_id, "rank": rank, "token": str(token)}
    items = []
    if started_at is None:
        items.append({**head, "kind": "started", "pid": 1000 + attempt_id})
        if not finish and rng.random() < 0.7:
            return items
    if stop:  # told to stop (preempted, cancelled): its processes are gone
        return [*items, {**head, "kind": "finished", "exit_code": -15}]
    roll = rng.random()
    if finish or roll < 0.55:
        return [*items, {**head, "kind": "finished", "exit_code": 0}]
    if roll < 0.7:
        return [*items, {**head, "kind": "finished", "exit_code": 1}]
    return items


def _anything_active() -> bool:
    return (
        Job.objects.filter(state__in=JOB_ACTIVE).exists()
        or JobArray.objects.filter(ended_at=None).exists()
        or AttemptMember.objects.filter(ended_at=None).exists()
    )


# --- the invariants, read from the database -------------------------------------------------------


def one_execution_per_group() -> list[str]:
    """Followers and hits never ran (an heir is an origin by then); a follower that succeeded
    did so with its origin's result."""
    ran = CachedJob.objects.filter(
        role__in=[CacheRole.FOLLOWER, CacheRole.HIT], job__attempts__isnull=False
    ).distinct()
    out = [
        f"{link.role} {link.job_id} of origin {link.source_id} ran an attempt of its own"
        for link in ran
    ]
    own = CachedJob.objects.filter(
        role=CacheRole.FOLLOWER, job__state=JobState.SUCCEEDED, job__cache_hit=False
    )
    out += [f"follower {link.job_id} succeeded without its origin's result" for link in own]
    return out


def caps_exact() -> list[str]:
    return [
        f"tenant {tenant}: kept count {kept}, queue {counted}"
        for tenant, (kept, counted) in queued.differences().items()
    ]


def one_job_per_key(keyed: dict[str, set]) -> list[str]:
    out = []
    rows = {
        f"{slug}:{key}": str(job)
        for slug, key, job in IdempotencyKey.objects.values_list("tenant__slug", "key", "job_id")
    }
    for name, ids in keyed.items():
        if len(ids) != 1 or rows.get(name) not in ids:
            out.append(f"key {name}: answered with jobs {sorted(ids)}, recorded {rows.get(name)}")
    return out


def stuck() -> list[str]:
    active = Job.objects.filter(state__in=JOB_ACTIVE).values_list(
        "pk", "state", "held_by_dependencies", "reason"
    )
    arrays = JobArray.objects.filter(ended_at=None).values_list(
        "pk", "materialised", "size", "held_by_dependencies"
    )
    return [f"job {pk} still {state} after the drain (held: {held}): {reason}" for pk, state, held, reason in active[:50]] + [
        f"array {pk} never ended ({made} of {size} made, held: {held})" for pk, made, size, held in arrays[:50]
    ]  # fmt: skip


def dependents_settled() -> list[str]:
    """Every condition decided (aftercorr's row stays pending: it is decided task by task, and
    its dependent array ended, `stuck`); a dependent with a condition that can never hold failed
    (or was cancelled), one whose conditions all held was released (not failed by them)."""
    undecided = JobDependency.objects.filter(state=DependencyState.PENDING).exclude(
        condition="aftercorr"
    )
    pending = undecided.values_list(
        "pk", "condition", "job_id", "job__state", "array_id", "array__ended_at", "parent_job_id",
        "parent_job__state", "parent_array_id", "parent_array__ended_at",
    )  # fmt: skip
    out = [
        f"dependency {pk} ({condition}) of {'job' if job else 'array'} {job or array} "
        f"({job_state or f'ended {array_ended}'}) on {'job' if parent_job else 'array'} "
        f"{parent_job or parent_array} ({parent_state or f'ended {parent_ended}'}) still pending"
        for pk, condition, job, job_state, array, array_ended, parent_job, parent_state, parent_array, parent_ended in pending[
            :50
        ]
    ]
    rows = defaultdict(set)
    for job, state in JobDependency.objects.exclude(job=None).values_list("job_id", "state"):
        rows[job].add(state)
    states = dict(Job.objects.filter(pk__in=list(rows)).values_list("pk", "state"))
    reasons = dict(Job.objects.filter(pk__in=list(rows)).values_list("pk", "reason"))
    for job, decided in rows.items():
        if DependencyState.NEVER in decided and states[job] not in (
            JobState.FAILED,
            JobState.CANCELLED,
        ):
            out.append(f"job {job} {states[job]} although a condition of it can never hold")
        if decided == {DependencyState.SATISFIED} and reasons[job].startswith("dependency "):
            out.append(f"job {job} failed by its dependencies although all held: {reasons[job]}")
    return out


def arrays_ended_once(ends: Counter) -> list[str]:
    out = []
    recorded = Counter(
        str(data["array"])
        for data in JobEvent.objects.filter(kind="array").values_list("data", flat=True)
    )
    for array in JobArray.objects.values_list("pk", flat=True):
        name = str(array)
        if ends[name] != 1:
            out.append(f"array {name}: its end recorded {ends[name]} times (ArrayEnded committed)")
        if recorded[name] > 1:
            out.append(f"array {name}: {recorded[name]} 'array ended' events")
    return out


def gpus_held_once() -> list[str]:
    by_gpu = defaultdict(list)
    now = timezone.now()
    for gpu, allocated, released in GpuAllocation.objects.values_list(
        "gpu_id", "allocated_at", "released_at"
    ):
        by_gpu[gpu].append((allocated, released or now))
    out = []
    for gpu, spans in by_gpu.items():
        spans.sort()
        for (_, end), (start, _) in zip(spans, spans[1:], strict=False):
            if start < end:
                out.append(
                    f"GPU {gpu}: an allocation from {start} while another held it until {end}"
                )
    held = GpuAllocation.objects.filter(released_at=None, attempt__state__in=ATTEMPT_TERMINAL)
    out += [f"GPU {a.gpu_id} still held by ended attempt {a.attempt_id}" for a in held]
    return out


# --- the server's log ---------------------------------------------------------------------------


def _server_log_file() -> str | None:
    """The PostgreSQL server's log, where this process can read it: GPUPLATFORM_PG_LOG, or
    Debian's /var/log/postgresql/postgresql-<version>-main.log."""
    named = os.environ.get("GPUPLATFORM_PG_LOG")
    candidates = (
        [named] if named else sorted(glob.glob("/var/log/postgresql/postgresql-*-main.log"))
    )
    return next((path for path in candidates if path and os.access(path, os.R_OK)), None)


def _server_log_start() -> tuple[str, int] | None:
    path = _server_log_file()
    return (path, os.path.getsize(path)) if path else None


def _server_log(at: tuple[str, int] | None) -> list[str]:
    if at is None:
        return ["(not readable from here: set GPUPLATFORM_PG_LOG to the server log's path)"]
    path, offset = at
    database = connection.settings_dict["NAME"]
    with open(path, "rb") as handle:
        handle.seek(offset)
        text = handle.read().decode(errors="replace")
    mine, keep = [], False
    for line in text.splitlines():
        if line[:4].isdigit():  # a new message, with the log_line_prefix: ours or another's
            keep = f"@{database} " in line
        if keep:  # and the continuation lines of ours (a deadlock's DETAIL names each query)
            mine.append(line)
    return [f"({path}, {len(mine)} lines for database {database})", *mine[-3000:]]
