"""The node agent: `python -m workers.agent --node NAME --sku SKU --gpus N [--fake] [--labels k=v,...]`.

It discovers the node's GPUs (NVML, or a fake inventory), registers them, heartbeats with GPU
health and utilisation, consumes its node's Celery queue for start/stop hand-offs, and runs
each attempt member through the runner. Every heartbeat it also compares what runs here with
what the database says should, and repairs the difference (messages are only hints).
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

log = logging.getLogger("workers.agent")


def parse_labels(text: str) -> dict[str, str]:
    labels = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise argparse.ArgumentTypeError(f"labels want k=v[,k=v...], got {item!r}")
        labels[key] = value
    return labels


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m workers.agent", description=__doc__.split("\n\n")[0])
    parser.add_argument("--node", required=True, help="node name, unique in the cluster")
    parser.add_argument("--sku", required=True, help='GPU SKU of this node, e.g. "H100-80GB"')
    parser.add_argument("--gpus", type=int, required=True, help="GPUs to offer (fake count, or at most what NVML finds)")
    parser.add_argument("--fake", action="store_true", help="declare GPUs that do not exist (no NVML)")
    parser.add_argument("--labels", type=parse_labels, default={}, help="k=v,k=v (rack, zone, ...)")
    parser.add_argument("--concurrency", type=int, default=4, help="Celery threads for hand-offs")
    args = parser.parse_args(argv)
    if not 1 <= args.gpus <= 64:
        parser.error("--gpus must be between 1 and 64")
    return args


class DbReporter:
    """The runner's reports, written through the job services (fenced by the attempt token)."""

    def started(self, run) -> bool:
        """False: the attempt or member ended before this process started (the runner stops it)."""
        from apps.jobs.services import attempt_member_started

        a = run.assignment
        return attempt_member_started(attempt_id=a.attempt_id, rank=a.rank, token=a.token, pid=run.process.pid)

    def progress(self, run, progress: float, checkpoint: str) -> None:
        from apps.jobs.services import attempt_progress

        attempt_progress(attempt_id=run.assignment.attempt_id, token=run.assignment.token, progress=progress,
                         checkpoint=checkpoint)  # fmt: skip

    def finished(self, run, exit_code, reason: str, checkpoint: str) -> None:
        from apps.jobs.services import attempt_member_finished, attempt_member_lost
        from workers.runner import FENCED, UNASSIGNED

        a = run.assignment
        # Stopped by the agent, not the job's fault: retried. (If the database already ended the
        # member, as it has for UNASSIGNED unless a race fooled the agent, this changes nothing.)
        lost = {"agent stopping": "agent stopped", FENCED: f"agent {FENCED}", UNASSIGNED: f"agent: {UNASSIGNED}"}
        if run.stop_reason in lost:
            attempt_member_lost(attempt_id=a.attempt_id, rank=a.rank, token=a.token, reason=lost[run.stop_reason])
            return
        attempt_member_finished(attempt_id=a.attempt_id, rank=a.rank, token=a.token, exit_code=exit_code,
                                reason=reason, checkpoint=checkpoint)  # fmt: skip

    def lost(self, run, reason: str) -> None:
        from apps.jobs.services import attempt_member_lost

        a = run.assignment
        attempt_member_lost(attempt_id=a.attempt_id, rank=a.rank, token=a.token, reason=reason)

    def sync_log(self, run) -> None:
        from workers.storage import put_file

        a = run.assignment
        suffix = "" if a.rank == 0 else f".rank-{a.rank}"
        put_file(f"logs/{a.job_id}/attempt-{a.attempt_number}{suffix}.log", run.log_path)

    def collect(self, run, name: str, source) -> None:
        """`source`: the artifact opened safely by the runner; spooled to a file of the agent's
        own, since artifact_store reads a path."""
        import shutil
        import tempfile

        from apps.jobs.services import artifact_store

        with tempfile.NamedTemporaryFile(dir=run.log_path.parent, prefix=".artifact-") as spool:
            shutil.copyfileobj(source, spool)
            spool.flush()
            artifact_store(attempt_id=run.assignment.attempt_id, token=run.assignment.token, name=name,
                           path=pathlib.Path(spool.name))  # fmt: skip


class Agent:
    def __init__(self, args: argparse.Namespace):
        from django.conf import settings

        from workers.runner import Runner

        self.args = args
        self.instance = uuid.uuid4().hex
        self.settings = settings
        self.stopping = threading.Event()
        self.nvml = None
        # When the database last took our heartbeat (its start), and how long we may go without
        # one: as long as the platform waits before it declares the node lost. Measured from
        # before the heartbeat's write, we fence first; a lost node's jobs then wait out their
        # retry backoff before they can start elsewhere.
        self.last_heartbeat = time.monotonic()
        self.fence_after = settings.HEARTBEAT_SECONDS * settings.NODE_LOST_AFTER_HEARTBEATS
        self.runner = Runner(node=args.node, data_dir=pathlib.Path(settings.DATA_DIR), reporter=DbReporter(),
                             kill_grace=settings.KILL_GRACE_SECONDS, fake_gpus=args.gpus if args.fake else 0)  # fmt: skip

    def discover(self):
        from workers.gpus import Nvml, fake_gpus

        if self.args.fake:
            return fake_gpus(self.args.node, self.args.gpus)
        self.nvml = Nvml()
        return self.nvml.gpus(limit=self.args.gpus)

    def register(self) -> None:
        from apps.nodes.services import NodeInfo, node_register

        self.runner.kill_orphans()
        gpus = self.discover()
        info = NodeInfo(name=self.args.node, sku=self.args.sku, gpus=gpus, labels=self.args.labels,
                        hostname=socket.gethostname())  # fmt: skip
        node_register(info=info, agent_instance=self.instance)
        log.info("node %s registered: %d x %s GPUs (%s), agent %s", self.args.node, len(gpus), self.args.sku,
                 "fake" if self.args.fake else "NVML", self.instance)  # fmt: skip

    def heartbeat_loop(self) -> None:
        from django.db import close_old_connections

        from apps.nodes.services import node_heartbeat

        while not self.stopping.wait(self.settings.HEARTBEAT_SECONDS):
            try:
                close_old_connections()
                began = time.monotonic()
                gpus = self.nvml.gpus(limit=self.args.gpus) if self.nvml else []
                if node_heartbeat(name=self.args.node, agent_instance=self.instance, gpus=gpus) is None:
                    log.error("another agent took over node %s; stopping", self.args.node)
                    self.runner.stop_all("agent replaced")
                    os._exit(3)
                self.last_heartbeat = began
                self.sync()
            except Exception:
                log.exception("heartbeat failed; retrying")

    def sync(self) -> None:
        """Make what runs here match what the database says runs here."""
        from apps.jobs.selectors import open_members_on
        from workers.runner import UNASSIGNED

        # Local runs first: a run launched (start message) after the database read would look
        # unassigned and be killed.
        with self.runner.lock:
            local = dict(self.runner.runs)
        wanted = open_members_on(self.args.node)
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
                from workers.runner import Run

                self.runner.reporter.lost(Run(assignment=want, workdir=pathlib.Path("."), log_path=pathlib.Path(".")),
                                          "ended before it started")  # fmt: skip

    def fence(self) -> None:
        """Cut off from the database (or too slow to reach it) for as long as the platform waits
        before it declares this node lost and runs its jobs elsewhere: kill every job here first,
        so that no job ever runs in two places at once."""
        if time.monotonic() - self.last_heartbeat > self.fence_after and self.runner.runs:
            self.runner.kill_all()

    def tick_loop(self) -> None:
        from django.db import close_old_connections

        while not self.stopping.wait(0.2):
            try:
                self.fence()
                close_old_connections()
                self.runner.tick()
            except Exception:
                log.exception("runner tick failed")

    def start_threads(self) -> None:
        for target, name in ((self.heartbeat_loop, "heartbeat"), (self.tick_loop, "runner-tick")):
            threading.Thread(target=target, name=name, daemon=True).start()

    def shutdown(self) -> None:
        """Graceful stop: jobs here are stopped and handed back to the queue, not failed."""
        self.runner.stop_all("agent stopping")
        deadline = time.monotonic() + self.settings.KILL_GRACE_SECONDS + 2
        while self.runner.runs and time.monotonic() < deadline:
            time.sleep(0.2)
        self.stopping.set()


def run_celery_worker(agent: Agent) -> None:
    from apps.scheduling.queues import node_queue
    from gpuplatform.celery import app

    worker = app.Worker(
        hostname=f"agent@{agent.args.node}", queues=[node_queue(agent.args.node)], pool="threads",
        concurrency=agent.args.concurrency, loglevel=os.environ.get("LOG_LEVEL", "INFO"),
        without_mingle=True, without_gossip=True, task_events=True,
    )  # fmt: skip
    worker.start()


def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "gpuplatform.settings")
    import django

    django.setup()
    from workers.gpus import NoGpuError

    agent = Agent(args)
    try:
        agent.register()
    except NoGpuError as error:
        print(f"agent: {error}", file=sys.stderr)
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
