"""The runner's reports, sent through the agent API (workers/agent_client.py), each fenced by the
attempt token; starts and ends of several members coalesce into one call (ReportBatcher). Files the job wrote (its checkpoint, its artifacts) are opened only through
workers/safefiles.py: a link the job planted is never followed."""

from __future__ import annotations

import logging
import os
import pathlib
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import BinaryIO

from apps.platform.agent_protocol import MAX_REPORTS_PER_CALL, Assignment
from apps.platform.names import LOST_BY_AGENT_STOP
from workers import inputs
from workers.agent_client import AgentApi, ApiError, TooLarge
from workers.isolation import env_int
from workers.runner import Reporter, Run
from workers.safefiles import open_job_file

log = logging.getLogger(__name__)
LOG_CHUNK = 4 << 20  # bytes of log per request
RETRY_DELAYS = (0.2, 1.0, 5.0)  # seconds before each new try of a report call that got no answer


Done = Callable[[bool | None, Exception | None], None]  # (accepted, or the error that stopped it)


# Milliseconds an agent holds a start or an end report, while reports are flowing, for others to
# go in the same call (workers/reporter.py ReportBatcher); 0: each goes as soon as no call is in
# flight; a start also waits, up to that much from when it was made, for its own end (a quick job's
# two go in one call). A held start shows the job `running` that much later.
# 30 (it was 10): on a busy node a fenced quick job's end often came more than 10 ms after its start.
COALESCE_MS = env_int("GPUPLATFORM_REPORT_COALESCE_MS", 30)
QUIET_SECONDS = 0.2  # no report made for this long: the next one goes at once, not held


@dataclass
class _Pending:
    assignment: Assignment
    kind: str
    body: dict
    done: Done
    at: float = 0.0  # time.monotonic() when made
    # A start made while reports flow: it may wait up to the window for its own end (a quick job)
    # even behind a call in flight, so that both go in one call and are one write each row.
    for_its_end: bool = False
    waited: bool = False  # made by `call`: goes as soon as no call is in flight


def _member(report: _Pending) -> tuple[int, int]:
    return report.assignment.attempt_id, report.assignment.rank


class ReportBatcher:
    """Sends the runner's started / progress / finished / lost reports, several members' in one
    call (`POST /reports/`), as a group commit does: one call is in flight at a time, and the
    reports that queue up meanwhile go together in the next call. A report that does not wait
    for its answer (`submit`: the launcher's starts, the tick's ends) made while reports are
    flowing (another was made less than QUIET_SECONDS before) is held up to `coalesce` seconds
    (GPUPLATFORM_REPORT_COALESCE_MS) for others to go with it: a drain's starts and ends come a
    few milliseconds apart, and a call's cost is mostly per request. A report made on a quiet
    node, one that is waited for (`call`, which takes whatever is queued along), and reports
    that already waited for a call in flight go at once, except a start made while reports flow,
    which waits for its own end until it is `coalesce` old, even behind a call in flight: a
    drain's quick job then has its start and end in one call, which the platform applies in one
    write of each row (apps/jobs/batch_reports.py members_ran_together) where it took two. None
    waits longer than `coalesce` beyond the call in flight, up to `max_items` go in one call,
    always in the order made.
    Against a control plane without the batch endpoint (404 or 405 for it) each report goes to
    its member's own endpoint, as before."""

    def __init__(self, api: AgentApi, *, max_items: int = MAX_REPORTS_PER_CALL,
                 retry_delays: tuple[float, ...] = RETRY_DELAYS, coalesce: float | None = None,
                 quiet: float = QUIET_SECONDS):  # fmt: skip
        self.api, self.max_items, self.retry_delays = api, max_items, retry_delays
        self.coalesce = COALESCE_MS / 1000 if coalesce is None else coalesce
        self.quiet = quiet
        self.single = False  # the control plane has no batch endpoint
        self.calls = 0  # requests sent (for tests and logs)
        self._pending: list[_Pending] = []
        self._busy = False  # a call is in flight
        self._hold_until = 0.0  # the queued reports wait for company until then (monotonic)
        self._last_made = float("-inf")  # when the last report was made
        self._ready = threading.Condition()
        self._thread: threading.Thread | None = None

    def submit(self, assignment: Assignment, kind: str, body: dict, done: Done) -> None:
        """Queue a report; `done(accepted, error)` is called once it is answered (from the
        thread that sent it): accepted False when refused (stale token, ended, not placed here)."""
        with self._ready:
            now = time.monotonic()
            flowing = now - self._last_made < self.quiet
            if not self._pending and not self._busy:
                # The first of a new batch: held only while reports are flowing.
                self._hold_until = now + self.coalesce if flowing else now
            self._last_made = now
            for_its_end = flowing and kind == "started" and self.coalesce > 0
            self._pending.append(_Pending(assignment, kind, body, done, now, for_its_end))
            self._wake()

    def call(self, assignment: Assignment, kind: str, **body) -> bool:
        """A report, waited for (sent at once, with whatever is queued): raises what stopped it."""
        answered = threading.Event()
        outcome: list = [None, None]

        def done(accepted: bool | None, error: Exception | None) -> None:
            outcome[:] = [accepted, error]
            answered.set()

        with self._ready:
            self._last_made = time.monotonic()
            self._pending.append(
                _Pending(assignment, kind, body, done, self._last_made, waited=True)
            )
            if self._busy:
                self._hold_until = 0.0  # the next call goes as soon as this one is answered
                self._wake()
                batch = None
            else:  # in order: whatever was queued before it goes first
                self._busy = True
                batch = self._take()
        if batch is not None:
            try:
                self._send(batch)
            finally:
                with self._ready:
                    self._busy = False
                    self._wake()
        answered.wait()
        if outcome[1] is not None:
            raise outcome[1]
        return bool(outcome[0])

    def _due(self) -> float:  # holding self._ready
        """When the queued reports go (monotonic): at `_hold_until`, unless the oldest start that
        waits for its own end (`for_its_end`), which has not come, is younger than `coalesce`.
        A waited report goes at once, whatever is queued."""
        if any(p.waited for p in self._pending):
            return self._hold_until
        ended = {_member(p) for p in self._pending if p.kind != "started"}
        for p in self._pending:
            if p.for_its_end and _member(p) not in ended:
                return max(self._hold_until, p.at + self.coalesce)
        return self._hold_until

    def _take(self) -> list[_Pending]:  # holding self._ready
        batch = self._pending[: self.max_items]
        del self._pending[: self.max_items]
        self._hold_until = 0.0  # what is left (or queues during the call) goes when it is answered
        return batch

    def _wake(self) -> None:  # holding self._ready
        if self._pending and not self._busy:
            if self._thread is None:
                self._thread = threading.Thread(target=self._loop, name="reports", daemon=True)
                self._thread.start()
            self._ready.notify_all()

    def _loop(self) -> None:
        while True:
            with self._ready:
                while True:
                    if self._pending and not self._busy:
                        left = self._due() - time.monotonic()
                        if left <= 0 or len(self._pending) >= self.max_items:
                            break
                        self._ready.wait(left)
                    else:
                        self._ready.wait()
                self._busy = True
                batch = self._take()
            try:
                self._send(batch)
            finally:
                with self._ready:
                    self._busy = False
                    self._wake()

    def _send(self, batch: list[_Pending]) -> None:
        answers: list[tuple[bool | None, Exception | None]]
        for delay in (*self.retry_delays, None):
            try:
                answers = self._batch(batch) if not self.single else self._one_by_one(batch)
            except ApiError as error:
                if error.status in (404, 405) and not self.single:
                    log.warning("the platform has no batch report endpoint; reporting one by one")
                    self.single = True
                    self._send(batch)
                    return
                if error.status is None and delay is not None:
                    # No answer (a connection reset as a keep-alive connection closed, the web
                    # restarting): sent again. A report the platform did apply is refused or,
                    # for a start, accepted again; it is never applied twice.
                    log.warning(
                        "%s; sending its %d reports again in %.1f s", error, len(batch), delay
                    )
                    time.sleep(delay)
                    continue
                answers = [(None, error)] * len(batch)
            except Exception as error:  # never let the sender thread die
                answers = [(None, error)] * len(batch)
            break
        for item, (accepted, failure) in zip(batch, answers, strict=True):
            try:
                item.done(accepted, failure)
            except Exception:
                log.exception("handling the answer to a %s report failed", item.kind)

    def _batch(self, batch: list[_Pending]) -> list[tuple[bool | None, Exception | None]]:
        items = [{"attempt_id": p.assignment.attempt_id, "rank": p.assignment.rank, "token": p.assignment.token,
                  "kind": p.kind, **p.body} for p in batch]  # fmt: skip
        self.calls += 1
        answers: list[tuple[bool | None, Exception | None]] = []
        for item, result in zip(batch, self.api.reports(items), strict=True):
            status = result.get("status", 200)
            if status == 200:
                answers.append((bool(result.get("accepted")), None))
            elif status == 404:
                answers.append((False, None))  # as the single endpoint's 404: refused
            else:
                what = f"{item.kind} report of attempt {item.assignment.attempt_id} rank {item.assignment.rank}"
                answers.append(
                    (None, ApiError(f"{what}: {status} {result.get('errors', '')}", status))
                )
        return answers

    def _one_by_one(self, batch: list[_Pending]) -> list[tuple[bool | None, Exception | None]]:
        answers: list[tuple[bool | None, Exception | None]] = []
        for item in batch:
            self.calls += 1
            try:
                answers.append((self.api.report(item.assignment, item.kind, **item.body), None))
            except Exception as error:
                answers.append((None, error))
        return answers


class HttpReporter(Reporter):
    # A member's reports reach the platform in the order made (ReportBatcher: one call at a time,
    # its items applied in order), so the runner may report an end before its start is answered.
    reports_in_order = True

    def __init__(self, api: AgentApi):
        self.api = api
        self.batcher = ReportBatcher(api)

    def started(self, run: Run) -> bool:
        """False: the attempt or member ended before this process started (the runner stops it)."""
        # pid 0: reported before its process starts, while its own code is prepared
        # (workers/prepare.py), so that the attempt's lease is renewed meanwhile.
        return self.batcher.call(run.assignment, "started", **_started_body(run))

    def started_later(self, run: Run, done: Done) -> None:
        """`started` without waiting: `done(accepted, error)` once it is answered."""
        self.batcher.submit(run.assignment, "started", _started_body(run), done)

    def leader_port(self, run: Run) -> int | None:
        a = run.assignment
        current = self.api.assignment(a.attempt_id, a.rank, a.token)
        return None if current is None or not current.active else current.master_port

    def progress(self, run: Run, progress: float, checkpoint: str) -> None:
        stored = self._store_checkpoint(run, checkpoint)
        self.batcher.call(run.assignment, "progress", progress=progress, checkpoint=stored)

    def finished(self, run: Run, exit_code, reason: str, checkpoint: str) -> None:
        kind, body = self._end(run, exit_code, reason, checkpoint)
        self.batcher.call(run.assignment, kind, **body)

    def finished_later(self, run: Run, exit_code, reason: str, checkpoint: str, done: Done) -> None:
        """`finished` without waiting for the answer (the checkpoint is stored first, here)."""
        kind, body = self._end(run, exit_code, reason, checkpoint)
        self.batcher.submit(run.assignment, kind, body, done)

    def _end(self, run: Run, exit_code, reason: str, checkpoint: str) -> tuple[str, dict]:
        # Stopped by the agent, not the job's fault: retried. (If the platform already ended the
        # member, as it has for UNASSIGNED unless a race fooled the agent, the report changes nothing.)
        lost = LOST_BY_AGENT_STOP.get(run.stop_reason)
        if lost is not None:
            return "lost", {"reason": lost[:300]}
        if run.failure == "lost":  # it could not be prepared through no fault of the job's
            return "lost", {"reason": reason[:300]}
        stored = self._store_checkpoint(run, checkpoint)
        body = {"exit_code": exit_code, "reason": reason[:300], "checkpoint": stored}
        if run.failure == "final":  # its own code could not be prepared: never retried
            body["retryable"] = False
        return "finished", body

    def lost(self, run: Run, reason: str) -> None:
        self.batcher.call(run.assignment, "lost", reason=reason[:300])

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

    def image_auth(self, run: Run) -> str | None:
        return self.api.get_image_auth(run.assignment)

    def image_digest(self, run: Run, digest: str) -> str:
        return self.api.report_image_digest(run.assignment, digest)

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

    def store_checkpoint(self, run: Run, checkpoint: str) -> None:
        self._store_checkpoint(run, checkpoint)

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


def _started_body(run: Run) -> dict:
    """A start report: the pid (0 while its own code is prepared), and a gang's rank 0's
    MASTER_PORT, which the other members wait for (workers/ports.py). A job of one member keeps
    its port to itself: nobody waits for it, and a start without one is what the platform
    applies together with other starts, or with the job's own end, in one write (a drain's
    quick jobs: apps/nodes/agent_reports.py), where a start with a port goes alone."""
    body = {"pid": run.process.pid if run.process is not None else 0}
    if run.assignment.rank == 0 and run.master_port and run.assignment.world_size > 1:
        body["master_port"] = run.master_port
    return body
