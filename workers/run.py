"""One member of an attempt as the runner sees it (Run), and what the runner tells the platform
through (Reporter: the agent wires it to the agent API, workers/reporter.py; tests record)."""

from __future__ import annotations

import os
import pathlib
import subprocess
import threading
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import BinaryIO

from apps.platform.agent_protocol import Assignment
from workers import isolation as fence
from workers.forkserver import Launched
from workers.safefiles import open_job_file


@dataclass
class Run:
    assignment: Assignment  # what the agent API placed here (apps/platform/agent_protocol.py)
    workdir: pathlib.Path
    log_path: pathlib.Path  # in the agent's own dir: the job cannot replace it
    process: subprocess.Popen | Launched | None = None
    started: float = 0.0
    stop_reason: str = ""  # a StopReason, the platform's word, or what the job went over
    stop_deadline: float | None = None
    # signals still to send: [(signal, wait seconds)]
    stop_plan: list[tuple[int, float | None]] = field(default_factory=list)
    exit_code: int | None = None
    finished: bool = False
    reported_progress: tuple | None = None
    # Its log's size when last synced: an empty log has nothing to send before the end.
    log_size: int = 0
    launch_error: str = ""
    start_reported: bool = False  # its end is reported only after its start
    extra: dict = field(default_factory=dict)
    checkpoint_dir: pathlib.Path | None = None
    uid: int | None = None  # the job's own uid when fenced; None: it runs as the agent
    cgroup: fence.JobCgroup | None = None
    over_limit: str = ""  # "log over N bytes", "output over N bytes": the job is stopped for it
    log_reader: threading.Thread | None = None
    output_checked: float = 0.0
    # Own code (workers/prepare.py): how a failure before the process started is reported
    # ("final": failed, never retried; "lost": the platform retries it), the bundle's cache
    # lease (held while the member runs), the environment's dir, the secrets' values (in
    # memory only: the job's environment and the log masker).
    failure: str = ""
    bundle_lease: object | None = None
    env_dir: pathlib.Path | None = None
    secret_values: dict[str, str] = field(default_factory=dict, repr=False)
    master_port: int = 0  # MASTER_PORT: leased here for rank 0 (workers/ports.py), else rank 0's

    @property
    def key(self) -> tuple[int, int]:
        return (self.assignment.attempt_id, self.assignment.rank)

    @property
    def owner(self) -> int:
        """Who the files the job writes belong to: read back only if they still do."""
        return os.geteuid() if self.uid is None else self.uid

    def open_job_file(self, path: str | pathlib.Path) -> BinaryIO | None:
        """A file the job wrote (its work dir or checkpoint dir), opened without trusting it."""
        for root in filter(None, (self.workdir, self.checkpoint_dir)):
            handle = open_job_file(path, root=root, owner=self.owner)
            if handle is not None:
                return handle
        return None


class Reporter:
    """How the runner tells the platform what happened (the agent wires it to the services)."""

    def started(self, run: Run) -> bool | None:
        """False: the attempt ended before its process started (the runner stops it)."""

    def progress(self, run: Run, progress: float, checkpoint: str) -> None: ...
    def finished(self, run: Run, exit_code: int | None, reason: str, checkpoint: str) -> None: ...
    def lost(self, run: Run, reason: str) -> None: ...
    def sync_log(self, run: Run) -> None: ...
    def collect(self, run: Run, name: str, source: BinaryIO) -> None: ...
    def bundle_chunks(self, run: Run) -> Iterable[bytes]:
        """The member's code bundle as it arrives (workers/prepare.py verifies it)."""
        raise NotImplementedError("this reporter cannot fetch bundles")

    def secrets(self, run: Run) -> dict[str, str]:
        """The values of the member's secrets, by name."""
        raise NotImplementedError("this reporter cannot fetch secrets")

    def fetch_checkpoint(self, run: Run, dest_dir: pathlib.Path) -> str:
        """Put the attempt's stored checkpoint (if any) in dest_dir; its local path, or ""."""
        return ""

    def fetch_inputs(self, run: Run, dest_dir: pathlib.Path) -> None:
        """Put the artifacts of the job's parents in dest_dir (docs/pipelines.md)."""

    def store_checkpoint(self, run: Run, checkpoint: str) -> None:
        """Store the member's checkpoint file now (a rank other than 0, as it saves it)."""

    def leader_port(self, run: Run) -> int | None:
        """The MASTER_PORT rank 0's agent leased for the member's attempt: 0 not yet, None when
        the member is no longer placed here."""
        return run.assignment.master_port
