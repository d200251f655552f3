"""A whole platform for end-to-end tests: real Redis, a real database of its own, gunicorn,
the dispatcher (Celery worker + beat) and node agents, each a separate process."""

from __future__ import annotations

import json
import os
import pathlib
import signal
import socket
import subprocess
import sys
import time
import urllib.parse

import requests

ROOT = pathlib.Path(__file__).resolve().parents[2]
# Agent settings a test run or a bench hands on to every agent when set in its own environment
# (`GPUPLATFORM_SPARE_LAUNCHER=0 pytest ...`; bench._cpu_split compares the coalescing window).
AGENT_SETTINGS = ("GPUPLATFORM_SPARE_LAUNCHER", "GPUPLATFORM_REPORT_COALESCE_MS")
# The checkout first, then whatever the run was given (packages carried to a machine whose own
# Python lacks them, as on the GPU machine of tests/gpu/).
PYTHONPATH = os.pathsep.join([str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])])
FAST = {
    # 1 s x 3 before a node is lost: 0.5 s lost live nodes on a loaded 2-core machine.
    "GPUPLATFORM_HEARTBEAT_SECONDS": "1",
    "GPUPLATFORM_RECONCILE_TICK_SECONDS": "0.5",
    "GPUPLATFORM_DISPATCH_TICK_SECONDS": "1",
    "GPUPLATFORM_KILL_GRACE_SECONDS": "2",
    "GPUPLATFORM_STARTING_TIMEOUT": "30",
    "GPUPLATFORM_RETRY_BACKOFF_SECONDS": "0.5",
    "LOG_LEVEL": "INFO",
}


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def fresh_database_url(data_dir: pathlib.Path, name: str) -> str:
    """Its own database: a SQLite file, or a new PostgreSQL database beside DATABASE_URL's."""
    url = os.environ.get("DATABASE_URL", "")
    if not url.startswith(("postgres://", "postgresql://")):
        return f"sqlite:///{data_dir / (name + '.sqlite3')}"
    import psycopg

    parts = urllib.parse.urlsplit(url)
    # Named after DATABASE_URL's own database too: two runs beside each other, each with its own
    # DATABASE_URL, never drop each other's platform databases.
    name = f"{parts.path.strip('/') or 'test'}_{name}"
    admin = urllib.parse.urlunsplit(parts._replace(path="/postgres"))
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        conn.execute(f'CREATE DATABASE "{name}"')
    return urllib.parse.urlunsplit(parts._replace(path=f"/{name}"))


def separate_redis_url(db_index: int) -> str:
    parts = urllib.parse.urlsplit(os.environ["REDIS_URL"])
    url = urllib.parse.urlunsplit(parts._replace(path=f"/{db_index}"))
    import redis

    redis.Redis.from_url(url).flushdb()
    return url


class Platform:
    """`own_redis`: start an embedded Redis of its own (which `restart_redis` can wipe) instead
    of a database of the session's REDIS_URL; `env`: settings on top of FAST; `listen`: an
    address besides 127.0.0.1 where the web and the platform's own Redis also listen, for agents
    on other hosts (it needs `own_redis`: the session's Redis is not ours to rebind)."""

    def __init__(self, data_dir: pathlib.Path, *, name: str = "gpuplatform_e2e", redis_db: int = 1,
                 own_redis: bool = False, env: dict[str, str] | None = None,
                 listen: str | None = None):  # fmt: skip
        if listen and not own_redis:
            raise ValueError("listen needs own_redis")
        self.data_dir = data_dir
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.listen = listen
        self.processes: dict[str, subprocess.Popen] = {}
        self.killed: set[str] = set()  # processes stopped on purpose (not a failure to report)
        self.redis = None
        if own_redis:
            from gpuplatform import embedded_redis

            self.redis = embedded_redis.start(data_dir / "redis", persist=False)
            self._listen_redis()
        self.env = dict(os.environ, **FAST)
        self.env.update(
            GPUPLATFORM_DATA_DIR=str(data_dir),
            DATABASE_URL=fresh_database_url(data_dir, name),
            REDIS_URL=self.redis.url if self.redis else separate_redis_url(redis_db),
            PYTHONPATH=PYTHONPATH,
            GPUPLATFORM_URL=self.url,  # the agents the autoscaler's local provider starts reach it here
            GPUPLATFORM_TRUST_UNISOLATED_NODES="1",  # unprivileged test agents: isolation "none"
            **(env or {}),
        )
        if listen:
            self.env.update(self._listen_settings())
        self.tokens: dict[str, str] = {}
        self.agents: dict[str, list[str]] = {}
        self.agent_envs: dict[str, dict[str, str]] = {}

    # --- life cycle -------------------------------------------------------------------------

    def start(self, agents: dict[str, tuple[str, int, str]]) -> Platform:
        """`agents`: node name -> (SKU, GPU count, labels)."""
        self.manage("migrate", "--noinput", "-v", "0")
        seed = subprocess.run([sys.executable, "-m", "tests.e2e.seed"], cwd=ROOT, env=self.env, check=True,
                              capture_output=True, text=True)  # fmt: skip
        self.tokens = json.loads(seed.stdout.strip().splitlines()[-1])
        self.start_web()
        self.start_dispatcher("dispatcher")
        for node, (sku, gpus, labels) in agents.items():
            self.start_agent(node, sku, gpus, labels)
        self.wait_until(self.ready, timeout=90, what="web answering and every node registered")
        return self

    def start_web(self) -> None:
        """The Procfile's web (gpuplatform/web.py: two gunicorn masters of one uvicorn worker each,
        serving gpuplatform/asgi.py on one port)."""
        binds = [
            f"--bind={address}:{self.port}" for address in ("127.0.0.1", self.listen) if address
        ]
        self.spawn("web", [sys.executable, "-m", "gpuplatform.web", *binds, "--workers", "2",
                           "--threads", "4", "--timeout", "60", "--access-logfile", "-"])  # fmt: skip

    def start_dispatcher(self, name: str = "dispatcher") -> None:
        """A dispatcher (Celery worker on the control queue with its own beat); several may run."""
        self.spawn(name, [sys.executable, "-m", "celery", "-A", "gpuplatform", "worker", "-Q", "control", "-B",
                          "-n", f"{name}-{self.port}@%h", "--pool", "threads", "--concurrency", "4",
                          "-s", str(self.data_dir / f"beat-schedule-{name}"), "--loglevel", "INFO"])  # fmt: skip

    def restart_redis(self) -> None:
        """Stop the platform's own Redis and start an empty one on the same port: every queue,
        lock and counter is gone, as after a crash without persistence."""
        from gpuplatform import embedded_redis

        port = self.redis.port
        self.redis.process.kill()  # no shutdown save: whatever it held is gone
        self.redis.stop()
        self.redis = embedded_redis.start(self.data_dir / "redis", port=port, persist=False)
        self._listen_redis()

    def _listen_redis(self) -> None:
        """The embedded Redis listens on loopback only; add `listen` at run time (CONFIG SET)."""
        if self.listen:
            import redis

            redis.Redis.from_url(self.redis.url).config_set("bind", f"127.0.0.1 {self.listen}")

    def _listen_settings(self) -> dict[str, str]:
        """What the web needs to serve agents that come through `listen`: the Host they send, and
        the broker address to hand them (contract: GPUPLATFORM_AGENT_REDIS_URL, no credentials)."""
        hosts = os.environ.get("ALLOWED_HOSTS", "localhost,127.0.0.1,[::1],testserver")
        parts = urllib.parse.urlsplit(self.redis.url)
        return {"ALLOWED_HOSTS": f"{hosts},{self.listen}",
                "GPUPLATFORM_AGENT_REDIS_URL": f"redis://{self.listen}:{parts.port}{parts.path}"}  # fmt: skip

    def start_agent(
        self, node: str, sku: str, gpus: int, labels: str = "", *, fake: bool = True
    ) -> None:
        """`fake`: declared GPUs; else the agent finds them with NVML (tests/gpu)."""
        argv = [
            sys.executable,
            "-m",
            "workers.agent",
            "--node",
            node,
            "--sku",
            sku,
            "--gpus",
            str(gpus),
            *(["--fake"] if fake else []),
        ]
        if labels:
            argv += ["--labels", labels]
        self.agents[node] = argv
        self.agent_envs[node] = self.agent_environment(node)
        self.spawn(f"agent-{node}", argv, env=self.agent_envs[node])

    def agent_environment(self, node: str) -> dict[str, str]:
        """All an agent is given, as on another machine: the web's URL, its own credential (issued
        as an operator would), its own data dir. No database, no secret key, no Redis URL."""
        credential = self.manage("create_node_credential", node).strip().splitlines()[-1]
        return {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"), "PYTHONPATH": PYTHONPATH, "LOG_LEVEL": FAST["LOG_LEVEL"],
            "GPUPLATFORM_URL": self.url, "GPUPLATFORM_NODE_CREDENTIAL": credential,
            "GPUPLATFORM_DATA_DIR": str(self.agent_dir(node)),
            # Agent settings a run of the tests may turn on for every agent (off by default).
            **{name: os.environ[name] for name in AGENT_SETTINGS if name in os.environ},
        }  # fmt: skip

    def agent_dir(self, node: str) -> pathlib.Path:
        return self.data_dir / "agents" / node

    def restart_agent(self, node: str) -> None:
        self.spawn(f"agent-{node}", self.agents[node], env=self.agent_envs[node])

    def spawn(
        self, name: str, argv: list[str], env: dict[str, str] | None = None
    ) -> subprocess.Popen:
        log = open(self.data_dir / f"{name}.log", "ab")  # noqa: SIM115 (lives as long as the process)
        process = subprocess.Popen(argv, cwd=ROOT, env=self.env if env is None else env, stdout=log,
                                   stderr=subprocess.STDOUT, start_new_session=True)  # fmt: skip
        self.processes[name] = process
        self.killed.discard(name)
        return process

    def kill(self, name: str, signum: int = signal.SIGKILL, *, group: bool = False) -> None:
        """Signal one process (`group`: its whole process group, e.g. a dispatcher and its beat)."""
        process = self.processes[name]
        self.killed.add(name)
        try:
            (os.killpg if group else os.kill)(process.pid, signum)
        except ProcessLookupError:
            pass
        process.wait(10)

    def stop(self) -> None:
        for process in self.processes.values():
            if process.poll() is None:
                try:
                    os.killpg(process.pid, signal.SIGTERM)
                except ProcessLookupError:
                    pass
        for process in self.processes.values():
            try:
                process.wait(15)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
        if self.redis is not None:
            self.redis.stop()

    def manage(self, *args: str) -> str:
        result = subprocess.run([sys.executable, "manage.py", *args], cwd=ROOT, env=self.env, check=True,
                                capture_output=True, text=True)  # fmt: skip
        return result.stdout

    def logs(self, name: str, tail: int = 4000) -> str:
        path = self.data_dir / f"{name}.log"
        return path.read_text(errors="replace")[-tail:] if path.exists() else ""

    # --- the API, as a client sees it -----------------------------------------------------------

    def api(self, user: str | None) -> requests.Session:
        session = requests.Session()
        if user:
            session.headers["Authorization"] = f"Token {self.tokens[user]}"
        session.base = self.url  # type: ignore[attr-defined]
        return session

    def get(self, user: str, path: str) -> requests.Response:
        return self.api(user).get(self.url + path, timeout=30)

    def post(self, user: str, path: str, body: dict | None = None) -> requests.Response:
        return self.api(user).post(self.url + path, json=body, timeout=30)

    def submit(self, user: str, **body) -> dict:
        response = self.post(user, "/api/v1/jobs/", body)
        assert response.status_code == 201, response.text + (
            f"\n--- the web's log ---\n{self.logs('web')}" if response.status_code >= 500 else ""
        )
        return response.json()

    def job(self, job_id: str, user: str = "staff") -> dict:
        return self.get(user, f"/api/v1/jobs/{job_id}/").json()

    def wait_for_state(self, job_id: str, states, timeout: float = 90) -> dict:
        states = {states} if isinstance(states, str) else set(states)
        last = {}

        def reached():
            nonlocal last
            last = self.job(job_id)
            return last["state"] in states

        self.wait_until(
            reached,
            timeout=timeout,
            what=lambda: f"job {job_id} in {states} (last: {last.get('state')}, {last.get('reason')!r})",
        )
        return last

    def nodes(self) -> dict[str, dict]:
        return {n["name"]: n for n in self.get("staff", "/api/v1/nodes/").json()["results"]}

    def ready(self) -> bool:
        try:
            if requests.get(self.url + "/healthz", timeout=2).status_code != 200:
                return False
            nodes = self.nodes()
        except (requests.RequestException, ValueError):
            return False
        return all(name in nodes and nodes[name]["state"] == "ready" for name in self.agents)

    def wait_until(self, condition, *, timeout: float, what, interval: float = 0.2) -> None:
        """Poll `condition` until it holds; `what` (a string, or a function giving one at the
        timeout) names what was awaited in the error."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if condition():
                return
            for name, process in self.processes.items():
                if (
                    process.poll() is not None
                    and name in ("web", "dispatcher")
                    and name not in self.killed
                ):
                    raise AssertionError(
                        f"{name} exited ({process.returncode}):\n{self.logs(name)}"
                    )
            time.sleep(interval)
        tails = "\n".join(f"--- {name}\n{self.logs(name, 1500)}" for name in self.processes)
        what = what() if callable(what) else what
        raise AssertionError(f"timed out after {timeout}s waiting for {what}\n{tails}")
