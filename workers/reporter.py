"""The runner's reports, sent through the agent API (workers/agent_client.py), each fenced by the
attempt token. Files the job wrote (its checkpoint, its artifacts) are opened only through
workers/safefiles.py: a link the job planted is never followed."""

from __future__ import annotations

import logging
import os
import pathlib
from collections.abc import Iterator
from typing import BinaryIO

from apps.platform.names import LOST_BY_AGENT_STOP
from workers import inputs
from workers.agent_client import AgentApi, ApiError, TooLarge
from workers.runner import Reporter, Run
from workers.safefiles import open_job_file

log = logging.getLogger(__name__)
LOG_CHUNK = 4 << 20  # bytes of log per request


class HttpReporter(Reporter):
    def __init__(self, api: AgentApi):
        self.api = api

    def started(self, run: Run) -> bool:
        """False: the attempt or member ended before this process started (the runner stops it)."""
        # pid 0: reported before its process starts, while its own code is prepared
        # (workers/prepare.py), so that the attempt's lease is renewed meanwhile.
        pid = run.process.pid if run.process is not None else 0
        return self.api.report(run.assignment, "started", pid=pid)

    def progress(self, run: Run, progress: float, checkpoint: str) -> None:
        stored = self._store_checkpoint(run, checkpoint)
        self.api.report(run.assignment, "progress", progress=progress, checkpoint=stored)

    def finished(self, run: Run, exit_code, reason: str, checkpoint: str) -> None:
        # Stopped by the agent, not the job's fault: retried. (If the platform already ended the
        # member, as it has for UNASSIGNED unless a race fooled the agent, the report changes nothing.)
        lost = LOST_BY_AGENT_STOP.get(run.stop_reason)
        if lost is not None:
            self.lost(run, lost)
            return
        if run.failure == "lost":  # it could not be prepared through no fault of the job's
            self.lost(run, reason)
            return
        stored = self._store_checkpoint(run, checkpoint)
        extra = {"retryable": False} if run.failure == "final" else {}
        self.api.report(run.assignment, "finished", exit_code=exit_code, reason=reason[:300],
                        checkpoint=stored, **extra)  # fmt: skip

    def lost(self, run: Run, reason: str) -> None:
        self.api.report(run.assignment, "lost", reason=reason[:300])

    def sync_log(self, run: Run) -> None:
        """Send what the log gained since the last sync (appended where the stored copy ends)."""
        if run.extra.get("log_capped"):
            return
        source = open_job_file(run.log_path, root=run.log_path.parent)
        if source is None:
            log.warning("log of %s is not a plain file; not sent", run.key)
            return
        with source:
            sent = run.extra.get("log_sent", 0)
            while True:
                source.seek(sent)
                chunk = source.read(LOG_CHUNK)
                if not chunk:
                    break
                try:
                    appended, sent = self.api.append_log(run.assignment, sent, chunk)
                except TooLarge:
                    log.warning(
                        "log of %s passed the platform's cap; the rest is not sent", run.key
                    )
                    run.extra["log_capped"] = True
                    break
                run.extra["log_sent"] = sent
                if not appended and sent > os.fstat(source.fileno()).st_size:
                    log.warning("stored log of %s is longer than the local one; not sent", run.key)
                    break

    def collect(self, run: Run, name: str, source: BinaryIO | pathlib.Path) -> None:
        """One output file as an artifact. `source` is the file the runner opened safely; a path
        (a runner that does not open them itself) is opened here as the runner would."""
        if isinstance(source, str | os.PathLike):
            opened = run.open_job_file(source)
            if opened is None:
                log.warning(
                    "artifact %s of %s is not a plain file of the job's; skipped", name, run.key
                )
                return
            with opened:
                self._put_artifact(run, name, opened)
            return
        self._put_artifact(run, name, source)

    def _put_artifact(self, run: Run, name: str, source: BinaryIO) -> None:
        try:
            self.api.put_artifact(run.assignment, name, source)
        except TooLarge:
            log.warning("artifact %s of %s passed the platform's cap; not stored", name, run.key)

    def bundle_chunks(self, run: Run) -> Iterator[bytes]:
        return self.api.stream_bundle(run.assignment)

    def secrets(self, run: Run) -> dict[str, str]:
        return self.api.get_secrets(run.assignment)

    def fetch_checkpoint(self, run: Run, dest_dir: pathlib.Path) -> str:
        """Download the checkpoint the job resumes from (stored by whichever node ran it last)."""
        if getattr(run.assignment, "resume_from", None) == "":
            return ""  # the platform said there is none: no request
        try:
            return self.api.get_checkpoint(run.assignment, dest_dir)
        except ApiError as error:
            # Rather start from what is here (or from scratch) than not at all.
            log.warning("could not fetch the checkpoint of %s (%s)", run.key, error)
            return ""

    def fetch_inputs(self, run: Run, dest_dir: pathlib.Path) -> None:
        """Download the artifacts of the job's parents (workers/inputs.py)."""
        inputs.fetch(self.api, run.assignment, dest_dir)

    def _store_checkpoint(self, run: Run, checkpoint: str) -> str:
        """Upload the job's checkpoint file when it changed; the stored name ("" when none or unsafe)."""
        if not checkpoint:
            return run.extra.get("checkpoint_stored", "")
        source = run.open_job_file(checkpoint)  # below its work or checkpoint dir, still the job's
        if source is None:
            log.warning(
                "checkpoint %s of %s is not a plain file of the job's; not stored",
                checkpoint,
                run.key,
            )
            return run.extra.get("checkpoint_stored", "")
        with source:
            info = os.fstat(source.fileno())
            version = (checkpoint, info.st_mtime_ns, info.st_size)
            if run.extra.get("checkpoint_version") != version:
                try:
                    run.extra["checkpoint_stored"] = self.api.put_checkpoint(run.assignment, pathlib.Path(checkpoint).name,
                                                                             source)  # fmt: skip
                except TooLarge:
                    log.warning("checkpoint of %s passed the platform's cap; not stored", run.key)
                    return run.extra.get("checkpoint_stored", "")
                run.extra["checkpoint_version"] = version
        return run.extra["checkpoint_stored"]
