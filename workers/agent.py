"""The node agent: `python -m workers.agent --node NAME --sku SKU --gpus N [--fake] [--labels k=v,...]`.

It discovers the node's GPUs (NVML, or a fake inventory), registers them, heartbeats with GPU
health and utilisation, consumes its node's Celery queue for start/stop hand-offs, and runs
each attempt member through the runner. Every heartbeat it also compares what runs here with
what the platform says should, and repairs the difference (messages are only hints).

It speaks to the control plane only through the agent API (docs/architecture.md, "Agent API"),
and imports no Django: its whole configuration is GPUPLATFORM_URL, its node credential
(GPUPLATFORM_NODE_CREDENTIAL or --credential-file) and optionally GPUPLATFORM_DATA_DIR (its own
data dir); the broker URL and the platform's timings come from the register answer.
"""

from __future__ import annotations

import argparse
import logging
import os
import pathlib
import socket
import sys
import threading
import time
import uuid
from dataclasses import dataclass
from typing import TYPE_CHECKING

from apps.platform.agent_protocol import Assignment, GpuInfo
from apps.platform.names import StopReason
from workers.agent_client import AgentApi

if TYPE_CHECKING:
    from workers.gpus import Nvml
    from workers.runner import Run
    from workers.telemetry import Sampler

log = logging.getLogger("workers.agent")
Members = dict[tuple[int, int], Assignment]  # what the platform has placed here, by (attempt, rank)
Runs = dict[tuple[int, int], "Run"]  # what runs here


def parse_labels(text: str) -> dict[str, str]:
    labels = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise argparse.ArgumentTypeError(f"labels want k=v[,k=v...], got {item!r}")
        labels[key] = value
    return labels


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m workers.agent", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--node", required=True, help="node name, unique in the cluster")
    parser.add_argument("--sku", required=True, help='GPU SKU of this node, e.g. "H100-80GB"')
    parser.add_argument(
        "--gpus",
        type=int,
        required=True,
        help="GPUs to offer (fake count, or at most what NVML finds)",
    )
    parser.add_argument(
        "--fake", action="store_true", help="declare GPUs that do not exist (no NVML)"
    )
    parser.add_argument("--labels", type=parse_labels, default={}, help="k=v,k=v (rack, zone, ...)")
    parser.add_argument("--concurrency", type=int, default=4, help="Celery threads for hand-offs")
    parser.add_argument("--credential-file", type=pathlib.Path, default=None,
                        help="file holding the node credential (else GPUPLATFORM_NODE_CREDENTIAL)")  # fmt: skip
    args = parser.parse_args(argv)
    if not 1 <= args.gpus <= 64:
        parser.error("--gpus must be between 1 and 64")
    return args


@dataclass(frozen=True)
class Config:
    """Everything the agent is told, from its environment (and --credential-file)."""

    url: str
    credential: str
    data_dir: pathlib.Path
    heartbeat_seconds: float = 2.0  # until the register answer gives the platform's
    lost_after_heartbeats: int = 3
    kill_grace_seconds: float = 5.0

    @classmethod
    def from_env(cls, args: argparse.Namespace, environ=os.environ) -> Config:
        url = environ.get("GPUPLATFORM_URL", "")
        if not url.startswith(("http://", "https://")):
            raise SystemExit(
                "agent: GPUPLATFORM_URL must be the web's base URL, e.g. http://10.0.0.1:8000"
            )
        if args.credential_file is not None:
            credential = args.credential_file.read_text().strip()
        else:
            credential = environ.get("GPUPLATFORM_NODE_CREDENTIAL", "").strip()
        if not credential:
            raise SystemExit("agent: no node credential: set GPUPLATFORM_NODE_CREDENTIAL or pass --credential-file "
                             "(issue one with `python manage.py create_node_credential NAME`)")  # fmt: skip
        default_dir = pathlib.Path(__file__).resolve().parent.parent / "var" / f"agent-{args.node}"
        return cls(
            url=url, credential=credential,
            data_dir=pathlib.Path(environ.get("GPUPLATFORM_DATA_DIR") or default_dir).resolve(),
            heartbeat_seconds=float(environ.get("GPUPLATFORM_HEARTBEAT_SECONDS") or 2.0),
            lost_after_heartbeats=int(environ.get("GPUPLATFORM_NODE_LOST_AFTER") or 3),
            kill_grace_seconds=float(environ.get("GPUPLATFORM_KILL_GRACE_SECONDS") or 5.0),
        )  # fmt: skip


class Agent:
    def __init__(self, args: argparse.Namespace, *, config: Config, api: AgentApi | None = None):
        from workers.reporter import HttpReporter
        from workers.runner import Runner

        self.args, self.config = args, config
        self.api = api if api is not None else AgentApi(config.url, config.credential)
        self.instance = uuid.uuid4().hex
        self.stopping = threading.Event()
        self._sync_lock = threading.Lock()
        self._sync_wanted = threading.Event()
        self._sync_due: tuple[Members, Runs] | None = None
        self.nvml: Nvml | None = None
        self.telemetry: Sampler | None = None  # GPU sampling (workers/telemetry.py)
        self.platform: dict = {}  # the register answer: broker URL, queue, timings
        # The key this agent's start messages are signed with (the register answer's), in
        # memory only: None until registered, or where the platform signs none.
        self.message_key: bytes | None = None
        self.heartbeat_seconds = config.heartbeat_seconds
        self.kill_grace = config.kill_grace_seconds
        # When the platform last took our heartbeat (its start), and how long we may go without
        # one: as long as the platform waits before it declares the node lost. Measured from
        # before the heartbeat's request, we fence first; a lost node's jobs then wait out their
        # retry backoff before they can start elsewhere. Failed requests (the web down, the
        # network cut, the credential revoked) count as missed heartbeats.
        self.last_heartbeat = time.monotonic()
        self.fence_after = config.heartbeat_seconds * config.lost_after_heartbeats
        config.data_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        self.runner = Runner(node=args.node, data_dir=config.data_dir, reporter=HttpReporter(self.api),
                             kill_grace=config.kill_grace_seconds, fake_gpus=args.gpus if args.fake else 0)  # fmt: skip
        from workers.sessions import Sessions

        self.sessions = Sessions(self)  # shells, execs, forwarded ports (docs/interactive.md)

    def discover(self) -> list[GpuInfo]:
        from workers.gpus import Nvml, fake_gpus

        if self.args.fake:
            return fake_gpus(self.args.node, self.args.gpus)
        self.nvml = Nvml()
        return self.nvml.gpus(limit=self.args.gpus)

    def isolation(self) -> str:
        """How this agent fences its jobs (workers/isolation.py; the runner warns loudly at start
        when it cannot): "none", or how it does."""
        return self.runner.isolation.name

    def register(self) -> None:
        self.runner.kill_orphans()
        if self.runner.reaper is None:  # registers again after a restart of the platform
            self.runner.start_reaper()
        gpus = self.discover()
        isolation = self.isolation()
        self.platform = self.api.register(node=self.args.node, agent_instance=self.instance, sku=self.args.sku,
                                          gpus=gpus, labels=self.args.labels, hostname=socket.gethostname(),
                                          isolation=isolation)  # fmt: skip
        self.message_key = bytes.fromhex(self.platform.get("message_key") or "") or None
        self.heartbeat_seconds = float(self.platform["heartbeat_seconds"])
        self.fence_after = self.heartbeat_seconds * int(self.platform["node_lost_after_heartbeats"])
        self.kill_grace = self.runner.kill_grace = float(self.platform["kill_grace_seconds"])
        # A request may wait at most about one fence window per socket operation; a report that
        # times out is retried (its progress, log or end) on a later tick.
        self.api.timeout = max(5.0, self.fence_after)
        self.last_heartbeat = time.monotonic()
        self.start_telemetry(gpus)
        log.info("node %s registered: %d x %s GPUs (%s), agent %s, isolation %s", self.args.node, len(gpus),
                 self.args.sku, "fake" if self.args.fake else "NVML", self.instance, isolation)  # fmt: skip

    def start_telemetry(self, gpus: list[GpuInfo]) -> None:
        from workers.telemetry import DEFAULT_INTERVAL, Sampler

        if self.telemetry is not None:
            self.telemetry.stop()
        interval = float(self.platform.get("gpu_sample_seconds", DEFAULT_INTERVAL))
        self.telemetry = Sampler(self.runner, gpus=gpus, nvml=self.nvml, interval=interval,
                                 errors_file=self.config.data_dir / "fake-gpu-errors" if self.args.fake else None,
                                 activity=self.sessions.quiet_for)  # fmt: skip
        self.telemetry.start()

    def heartbeat_loop(self) -> None:
        """One heartbeat every interval, on a fixed beat (a slow answer does not push the next one
        back). What the answer says runs here is handed to the sync thread: launching a member it
        lists (spawn, checkpoint download, start report) must not delay the next beat."""
        due = time.monotonic()
        while True:
            due = max(due + self.heartbeat_seconds, time.monotonic())
            if self.stopping.wait(max(0.0, due - time.monotonic())):
                return
            try:
                answer = self.heartbeat_once()
            except Exception as error:
                log.warning("heartbeat failed (%s); retrying", error)
                continue
            with self._sync_lock:
                self._sync_due = answer  # the newest answer wins; an older one is stale anyway
            self._sync_wanted.set()

    def heartbeat_once(self) -> tuple[Members, Runs]:
        """Heartbeat; returns (what the platform has placed here, the local runs listed just before
        its read), for sync()."""
        began = time.monotonic()
        sampler = self.telemetry  # GPUs that changed and their samples ride the heartbeat
        gpus, samples = sampler.take() if sampler else ([], [])
        local = self.local_runs()  # before the platform's read, see sync()
        try:
            wanted = self.api.heartbeat(agent_instance=self.instance, gpus=gpus, samples=samples)
        except Exception:
            if sampler:
                sampler.put_back(gpus, samples)
            raise
        if wanted is None:
            log.error("another agent took over node %s; stopping", self.args.node)
            # Its jobs now belong to the new agent's platform view: none may outlive this one,
            # and os._exit skips the atexit hook that would kill their cgroups.
            self.runner.kill_everything("agent replaced")
            os._exit(3)
        self.last_heartbeat = began
        return wanted, local

    def sync_loop(self) -> None:
        while not self.stopping.is_set():
            if not self._sync_wanted.wait(1.0):
                continue
            with self._sync_lock:
                answer, self._sync_due = self._sync_due, None
                self._sync_wanted.clear()
            if answer is None:
                continue
            try:
                self.sync(*answer)
            except Exception:
                log.exception("sync failed; the next heartbeat tries again")

    def local_runs(self) -> Runs:
        with self.runner.lock:
            return dict(self.runner.runs)

    def sync(self, wanted: Members | None = None, local: Runs | None = None) -> None:
        """Make what runs here match what the platform says runs here (`wanted`: as the heartbeat
        answer read it, `local` listed before that request; else both read now)."""
        from workers.runner import UNASSIGNED, Run

        # Local runs first: a run launched (start message) after the platform's read would look
        # unassigned and be killed.
        if wanted is None:
            local = self.local_runs()
            wanted = self.api.assignments()
        assert local is not None  # given with `wanted`, or listed just now
        for key, run in local.items():
            want = wanted.get(key)
            if want is None or want.token != run.assignment.token:
                self.runner.stop(*key, why=UNASSIGNED)
            elif want.stop_requested:
                self.runner.stop(*key, why=want.stop_requested)
        for key, want in wanted.items():
            if key in local:
                continue
            if want.active and not want.stop_requested:
                self.runner.launch(want)  # its start message was lost or is late
            else:
                # Placed here, ended before it ever ran: nothing to stop, just settle it.
                self.runner.reporter.lost(Run(assignment=want, workdir=pathlib.Path("."), log_path=pathlib.Path(".")),
                                          "ended before it started")  # fmt: skip

    def fence(self) -> None:
        """Cut off from the platform (or too slow to reach it) for as long as it waits before it
        declares this node lost and runs its jobs elsewhere: kill every job here first, so that
        no job ever runs in two places at once."""
        if time.monotonic() - self.last_heartbeat > self.fence_after and self.runner.runs:
            self.runner.kill_all()

    def fence_loop(self) -> None:
        # Its own thread: a tick waiting on a slow or unreachable web must not delay the fence.
        while not self.stopping.wait(0.2):
            try:
                self.fence()
            except Exception:
                log.exception("fence check failed")

    def tick_loop(self) -> None:
        # Every 0.2 s, and at once when the runner says a run may have ended (runner.woken).
        while not self.stopping.is_set():
            self.runner.woken.wait(0.2)
            self.runner.woken.clear()
            try:
                self.fence()
                self.runner.tick()
            except Exception:
                log.exception("runner tick failed")

    def start_threads(self) -> None:
        loops = ((self.heartbeat_loop, "heartbeat"), (self.sync_loop, "sync"), (self.fence_loop, "fence"),
                 (self.tick_loop, "runner-tick"), (self.sessions.idle_loop, "sessions-idle"))  # fmt: skip
        for target, name in loops:
            threading.Thread(target=target, name=name, daemon=True).start()

    def shutdown(self) -> None:
        """Graceful stop: jobs here are stopped and handed back to the queue, not failed."""
        self.sessions.close_all()
        self.runner.stop_all(StopReason.AGENT_STOPPING)
        deadline = time.monotonic() + self.kill_grace + 2
        while self.runner.runs and time.monotonic() < deadline:
            time.sleep(0.2)
        self.stopping.set()


def run_celery_worker(agent: Agent) -> None:
    from workers import celery_app

    settings = agent.platform
    app = celery_app.configure(broker_url=settings["broker_url"], node=agent.args.node,
                               visibility_timeout=int(settings.get("visibility_timeout", 3600)))  # fmt: skip
    worker = app.Worker(
        hostname=f"agent@{agent.args.node}", queues=[settings["queue"]], pool="threads",
        concurrency=agent.args.concurrency, loglevel=os.environ.get("LOG_LEVEL", "INFO"),
        task_events=False, **celery_app.WORKER_OPTIONS,
    )  # fmt: skip
    worker.start()


def register_until_it_answers(agent: Agent) -> None:
    """The web may start after its agents (`make run`): retry, except a refusal of the credential."""
    from workers.agent_client import ApiError, CredentialRefused

    delay = 0.5
    while True:
        try:
            agent.register()
            return
        except CredentialRefused:
            raise
        except ApiError as error:
            if error.status is not None and 400 <= error.status < 500:
                raise
            log.warning("could not register yet (%s); retrying in %.1fs", error, delay)
            time.sleep(delay)
            delay = min(delay * 2, 10)


def forbid_django() -> None:
    """Make any import of Django in this process fail: the agent holds no platform secrets and must
    not grow a path to them (kombu's optional Django support then stays off, as it should)."""
    if "django" not in sys.modules:
        sys.modules["django"] = None  # type: ignore[assignment]


def main(argv: list[str] | None = None) -> int:
    forbid_django()
    args = parse_args(sys.argv[1:] if argv is None else argv)
    logging.basicConfig(level=os.environ.get("LOG_LEVEL", "INFO"),
                        format="%(asctime)s %(levelname)s %(name)s %(message)s")  # fmt: skip
    config = Config.from_env(args)
    from workers.agent_client import ApiError
    from workers.gpus import NoGpuError
    from workers.isolation import FenceRefused

    try:
        agent = Agent(args, config=config)
    except FenceRefused as error:
        print(f"agent: {error}", file=sys.stderr)
        return 2
    try:
        register_until_it_answers(agent)
    except NoGpuError as error:
        print(f"agent: {error}", file=sys.stderr)
        return 2
    except ApiError as error:
        print(f"agent: the platform refused to register node {args.node}: {error}", file=sys.stderr)
        return 2
    from workers import current

    current.AGENT = agent  # the node tasks in this process find it here
    agent.start_threads()
    try:
        run_celery_worker(agent)
    finally:
        agent.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
