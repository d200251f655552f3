"""The job runner inside a node agent: each attempt member is a subprocess (argv, never a
shell) in its own process group, with its GPUs in CUDA_VISIBLE_DEVICES, its own work dir, a
scrubbed environment, a max runtime, its log captured, and its output files collected.

All processes are spawned from one long-lived launcher thread, because the parent-death
signal (PR_SET_PDEATHSIG) fires when the spawning *thread* exits.
"""

from __future__ import annotations

import ctypes
import json
import logging
import os
import pathlib
import queue
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import BinaryIO

log = logging.getLogger(__name__)
SDK_DIR = pathlib.Path(__file__).resolve().parent / "sdk"
PR_SET_PDEATHSIG = 1
ENV_PASSTHROUGH = ("LD_LIBRARY_PATH", "CUDA_HOME", "NVIDIA_DRIVER_CAPABILITIES", "TZ")
FENCED = "cut off from the platform"  # the agent missed its heartbeats: its jobs die at once
UNASSIGNED = "not assigned here any more"  # the database no longer has it on this node


def _die_with_parent() -> None:  # runs in the child between fork and exec
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    except OSError:
        pass


@dataclass
class Run:
    assignment: object  # apps.jobs.selectors.Assignment
    workdir: pathlib.Path
    log_path: pathlib.Path
    process: subprocess.Popen | None = None
    started: float = 0.0
    stop_reason: str = ""  # "cancel", "timeout", "preempt", ...
    stop_deadline: float | None = None
    stop_plan: list = field(default_factory=list)  # signals still to send: [(signal, wait seconds)]
    exit_code: int | None = None
    finished: bool = False
    reported_progress: tuple | None = None
    log_size: int = -1
    launch_error: str = ""
    start_reported: bool = False  # its end is reported only after its start
    extra: dict = field(default_factory=dict)

    @property
    def key(self) -> tuple[int, int]:
        return (self.assignment.attempt_id, self.assignment.rank)


class Reporter:
    """How the runner tells the platform what happened (the agent's is workers/reporter.py, over
    the agent API)."""

    def started(self, run: Run) -> None: ...
    def progress(self, run: Run, progress: float, checkpoint: str) -> None: ...
    def finished(self, run: Run, exit_code: int | None, reason: str, checkpoint: str) -> None: ...
    def lost(self, run: Run, reason: str) -> None: ...
    def sync_log(self, run: Run) -> None: ...
    def collect(self, run: Run, name: str, source: BinaryIO) -> None:
        """Store one output file; `source` is open for reading (opened safely by the runner)."""

    def fetch_checkpoint(self, run: Run, dest_dir: pathlib.Path) -> str:
        """Download the attempt's stored checkpoint (if any) into dest_dir; its local path or ""."""
        return ""


class Runner:
    def __init__(self, *, node: str, data_dir: pathlib.Path, reporter: Reporter, kill_grace: float = 5.0):
        self.node, self.reporter, self.kill_grace = node, reporter, kill_grace
        self.data_dir = data_dir
        self.state_file = data_dir / "agents" / node / "runs.json"
        self.runs: dict[tuple[int, int], Run] = {}
        self.lock = threading.RLock()
        self._spawn_requests: queue.Queue = queue.Queue()
        self._launcher = threading.Thread(target=self._launch_loop, name="launcher", daemon=True)
        self._launcher.start()

    # --- commands -------------------------------------------------------------------------

    def launch(self, assignment) -> bool:
        """Start this member unless it already runs here (messages may arrive twice)."""
        key = (assignment.attempt_id, assignment.rank)
        with self.lock:
            if key in self.runs or not assignment.active or assignment.stop_requested:
                return False
            workdir = self.data_dir / "work" / assignment.job_id / f"attempt-{assignment.attempt_number}-rank-{assignment.rank}"
            run = Run(assignment=assignment, workdir=workdir, log_path=workdir / "job.log")
            self.runs[key] = run
        done = threading.Event()
        self._spawn_requests.put((run, done))
        done.wait(30)
        return True

    def stop(self, attempt_id: int, rank: int, why: str) -> None:
        """Stop a member: SIGTERM, then SIGKILL after the kill grace. A preemption first sends
        the checkpoint signal and waits the tier's grace period for the job to save and exit."""
        with self.lock:
            run = self.runs.get((attempt_id, rank))
            if not run or run.finished or run.stop_reason:
                return
            run.stop_reason = why or "stop"
            plan = [(signal.SIGTERM, self.kill_grace), (signal.SIGKILL, None)]
            if why == "preempt":
                checkpoint_signal = getattr(signal, run.assignment.checkpoint_signal, signal.SIGUSR1)
                plan.insert(0, (checkpoint_signal, run.assignment.grace_seconds))
            run.stop_plan = plan
            self._next_stop_signal(run)

    def _next_stop_signal(self, run: Run) -> None:
        signum, wait = run.stop_plan.pop(0)
        self._signal(run, signum)
        run.stop_deadline = None if wait is None else time.monotonic() + wait

    def kill_all(self, why: str = FENCED) -> None:
        """SIGKILL every job here now, no grace: the platform may already be running them elsewhere."""
        with self.lock:
            for run in [run for run in self.runs.values() if not run.finished]:
                if run.stop_reason != why:
                    log.error("attempt %s rank %s: %s; killing it", *run.key, why)
                    run.stop_reason, run.stop_plan, run.stop_deadline = why, [], None
                self._signal(run, signal.SIGKILL)

    def stop_all(self, why: str) -> None:
        with self.lock:
            keys = list(self.runs)
        for attempt_id, rank in keys:
            self.stop(attempt_id, rank, why)

    # --- the loop ---------------------------------------------------------------------------

    def tick(self) -> None:
        """Poll every run: exits, runtime limits, kill deadlines, progress, logs."""
        with self.lock:
            runs = list(self.runs.values())
        now = time.monotonic()
        for run in runs:
            if run.finished:
                continue
            if run.launch_error:
                self._finish(run, exit_code=127, reason=run.launch_error)
                continue
            if run.process is None or not run.start_reported:
                continue
            code = run.process.poll()
            if code is not None:
                self._kill_group(run, signal.SIGKILL)  # leftovers of the tree die with the job
                self._finish(run, exit_code=code, reason=self._reason(run, code))
                continue
            limit = run.assignment.max_runtime_seconds
            if not run.stop_reason and now - run.started > limit:
                log.info("attempt %s rank %s passed its max runtime %ss", *run.key, limit)
                self.stop(*run.key, why="timeout")
            if run.stop_deadline is not None and now > run.stop_deadline and run.stop_plan:
                self._next_stop_signal(run)
            self._report_progress(run)
            self._sync_log(run)

    def _reason(self, run: Run, code: int) -> str:
        if run.stop_reason == "timeout":
            return "timeout"
        if run.stop_reason:
            return run.stop_reason
        return "" if code == 0 else (f"killed by signal {-code}" if code < 0 else f"exit code {code}")

    def _finish(self, run: Run, *, exit_code: int | None, reason: str) -> None:
        run.finished, run.exit_code = True, exit_code
        self._report_progress(run)
        self._sync_log(run, force=True)
        if exit_code == 0 and not run.stop_reason:
            self._collect_outputs(run)
        checkpoint = self._checkpoint_path(run)
        try:
            self.reporter.finished(run, exit_code, reason, checkpoint)
        except Exception:
            log.exception("could not report the end of %s; will retry", run.key)
            run.finished = False
            return
        with self.lock:
            self.runs.pop(run.key, None)
            self._save_state()

    # --- spawning -----------------------------------------------------------------------------

    def _launch_loop(self) -> None:
        while True:
            run, done = self._spawn_requests.get()
            try:
                self._spawn(run)
            except Exception as error:  # bad argv, missing binary: the job failed, not the agent
                log.warning("could not start %s: %s", run.key, error)
                run.launch_error = f"could not start: {error}"[:300]
            finally:
                done.set()

    def _spawn(self, run: Run) -> None:
        a = run.assignment
        output = run.workdir / "output"
        control = run.workdir / ".gpuplatform"
        for path in (output, control, run.workdir / "tmp"):
            path.mkdir(parents=True, exist_ok=True)
        checkpoints = self.data_dir / "checkpoints" / a.job_id
        checkpoints.mkdir(parents=True, exist_ok=True)
        run.extra["checkpoint_dir"] = str(checkpoints)  # the reporter reads the job's checkpoint only below it
        argv = [sys.executable if part == "{python}" else part for part in a.argv]
        env = self._environment(run, output, control, checkpoints)
        with open(run.log_path, "ab") as log_file:
            run.process = subprocess.Popen(  # noqa: S603 (argv list, no shell, by design)
                argv, cwd=run.workdir, env=env, stdin=subprocess.DEVNULL, stdout=log_file,
                stderr=subprocess.STDOUT, start_new_session=True, preexec_fn=_die_with_parent,
            )  # fmt: skip
        run.started = time.monotonic()
        with self.lock:
            self._save_state()
        log.info("started attempt %s rank %s pid %s on GPUs %s", a.attempt_id, a.rank, run.process.pid, a.gpu_indices,
                 extra={"job_id": a.job_id, "attempt_id": a.attempt_id, "node": self.node, "rank": a.rank})  # fmt: skip
        try:
            accepted = self.reporter.started(run)
        except Exception:
            # The process runs: its end is still reported (and settles the attempt); never
            # report it finished while it runs, or its GPUs would go to another job.
            log.exception("could not report the start of attempt %s rank %s", a.attempt_id, a.rank)
            accepted = None
        finally:
            run.start_reported = True
        if accepted is False:
            # The attempt ended (lost, cancelled) between our read and the launch: stop it now
            # rather than at the next sync, so it never runs beside the job's next attempt.
            log.warning("attempt %s rank %s ended before its process started; stopping it", a.attempt_id, a.rank)
            self.stop(a.attempt_id, a.rank, why=UNASSIGNED)

    def _environment(self, run: Run, output, control, checkpoints) -> dict[str, str]:
        a = run.assignment
        # The checkpoint the platform stored (maybe from another node), else one saved here.
        fetch = getattr(self.reporter, "fetch_checkpoint", None)
        try:
            resume = fetch(run, checkpoints) if fetch else ""
        except Exception:
            log.warning("could not fetch the checkpoint of %s; resuming from what is here", run.key, exc_info=True)
            resume = ""
        if not resume and (checkpoints / "checkpoint.json").exists():
            resume = str(checkpoints / "checkpoint.json")
        env = {k: os.environ[k] for k in ENV_PASSTHROUGH if k in os.environ}
        env.update(
            PATH="/usr/local/bin:/usr/bin:/bin", HOME=str(run.workdir), TMPDIR=str(run.workdir / "tmp"),
            LANG="C.UTF-8", PYTHONUNBUFFERED="1", PYTHONPATH=str(SDK_DIR),
            CUDA_VISIBLE_DEVICES=",".join(str(i) for i in a.gpu_indices),
            RANK=str(a.rank), LOCAL_RANK="0", WORLD_SIZE=str(a.world_size),
            MASTER_ADDR=a.master_addr, MASTER_PORT=str(a.master_port),
            GPUPLATFORM_NODE=self.node, GPUPLATFORM_JOB_ID=a.job_id,
            GPUPLATFORM_ATTEMPT_ID=str(a.attempt_id), GPUPLATFORM_ATTEMPT=str(a.attempt_number),
            GPUPLATFORM_PARAMS=json.dumps(a.params), GPUPLATFORM_OUTPUT_DIR=str(output),
            GPUPLATFORM_CHECKPOINT_DIR=str(checkpoints), GPUPLATFORM_RESUME_FROM=resume,
            GPUPLATFORM_PROGRESS_FILE=str(control / "progress.json"),
            GPUPLATFORM_CHECKPOINT_FILE=str(control / "checkpoint.json"),
        )  # fmt: skip
        return env

    # --- signals and orphans ------------------------------------------------------------------

    def _signal(self, run: Run, signum: int) -> None:
        if run.process is not None and run.process.poll() is None:
            self._kill_group(run, signum)

    def _kill_group(self, run: Run, signum: int) -> None:
        if run.process is None:
            return
        try:
            os.killpg(run.process.pid, signum)
        except (ProcessLookupError, PermissionError):
            pass

    def _save_state(self) -> None:
        """Remember our process groups so a restarted agent can kill what the dead one left."""
        self.state_file.parent.mkdir(parents=True, exist_ok=True)
        groups = [run.process.pid for run in self.runs.values() if run.process is not None]
        tmp = self.state_file.with_suffix(".tmp")
        tmp.write_text(json.dumps({"process_groups": groups}))
        os.replace(tmp, self.state_file)

    def kill_orphans(self) -> int:
        """Kill job process groups left by an earlier agent of this node (checked by environ)."""
        try:
            groups = json.loads(self.state_file.read_text()).get("process_groups", [])
        except (FileNotFoundError, ValueError):
            return 0
        killed = 0
        for pgid in groups:
            if self._belongs_to_us(pgid):
                try:
                    os.killpg(pgid, signal.SIGKILL)
                    killed += 1
                except ProcessLookupError:
                    pass
        self.state_file.unlink(missing_ok=True)
        if killed:
            log.warning("killed %d orphaned job process group(s) from a previous agent", killed)
        return killed

    def _belongs_to_us(self, pid: int) -> bool:
        try:
            environ = pathlib.Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        except OSError:
            return False
        return f"GPUPLATFORM_NODE={self.node}".encode() in environ

    # --- progress, logs, outputs ---------------------------------------------------------------

    def _read_json(self, path: pathlib.Path) -> dict:
        try:
            return json.loads(path.read_text())
        except (FileNotFoundError, ValueError):
            return {}

    def _checkpoint_path(self, run: Run) -> str:
        return str(self._read_json(run.workdir / ".gpuplatform" / "checkpoint.json").get("path", ""))

    def _report_progress(self, run: Run) -> None:
        if run.assignment.rank != 0:
            return
        progress = self._read_json(run.workdir / ".gpuplatform" / "progress.json").get("progress")
        checkpoint = self._checkpoint_path(run)
        current = (progress, checkpoint)
        if progress is None or current == run.reported_progress:
            return
        try:
            self.reporter.progress(run, float(progress), checkpoint)
            run.reported_progress = current
        except Exception:
            log.warning("progress report failed for %s", run.key, exc_info=True)

    def _sync_log(self, run: Run, force: bool = False) -> None:
        try:
            size = run.log_path.stat().st_size
        except FileNotFoundError:
            return
        if size != run.log_size or force:
            try:
                self.reporter.sync_log(run)
                run.log_size = size
            except Exception:
                log.warning("log sync failed for %s", run.key, exc_info=True)

    def _collect_outputs(self, run: Run) -> None:
        output = run.workdir / "output"
        prefix = "" if run.assignment.rank == 0 else f"rank-{run.assignment.rank}/"
        for path in sorted(p for p in output.rglob("*") if p.is_file() and not p.is_symlink()):
            self.reporter.collect(run, prefix + path.relative_to(output).as_posix(), path)
