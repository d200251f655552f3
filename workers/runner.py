"""The job runner inside a node agent: each attempt member is a subprocess (argv, never a
shell) in its own process group, with its GPUs in CUDA_VISIBLE_DEVICES, its own work dir, a
scrubbed environment, a max runtime, its log captured through a pipe into the agent's own dir,
and its output files collected. Where the agent can fence (root, cgroups: workers/isolation.py)
each member also runs as its own uid in its own cgroup and mount namespace (workers/jail.py),
and is killed as a whole cgroup, so no descendant outlives it; those members are forked by a
small resident process (workers/forkserver.py), not by the agent.

All processes (the fork server too) are spawned from one long-lived launcher thread, because
the parent-death signal (PR_SET_PDEATHSIG) fires when the spawning *thread* exits.

Beside it: workers/run.py (a member, the Reporter), workers/jobenv.py (a member's argv and
environment), workers/joblog.py (its log, control files and outputs), workers/ports.py (the
MASTER_PORT rank 0 listens on, leased on the node while it runs).
"""

from __future__ import annotations

import atexit
import ctypes
import hashlib
import json
import logging
import os
import pathlib
import queue
import signal
import stat
import subprocess
import threading
import time
import uuid

from apps.platform.agent_protocol import Assignment
from apps.platform.names import EndReason, StopReason
from workers import images, jobenv, joblog, ports, reaper
from workers import isolation as fence
from workers.forkserver import ForkServer, LaunchFailed
from workers.jobenv import INTERPRETER_DIRS, SDK_DIR
from workers.run import Reporter, Run

log = logging.getLogger(__name__)
PR_SET_PDEATHSIG = 1
FENCED = StopReason.FENCED  # the agent missed its heartbeats: its jobs die at once
UNASSIGNED = StopReason.UNASSIGNED  # the database no longer has it on this node
OUTPUT_CHECK_SECONDS = 2.0  # how often the output dir is measured against its cap
SPARE_NAME = ".spare-"  # <instance>.spare-<id>: the fork server's spare's cgroups, no job yet
ENDED_REMEMBERED = 4096  # members that ran here, kept so that a stale order never runs them again
__all__ = ["FENCED", "UNASSIGNED", "Reporter", "Run", "Runner"]  # Run, Reporter: workers/run.py


def _die_with_parent() -> None:  # runs in the child between fork and exec
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    except OSError:
        pass


class Runner:
    def __init__(self, *, node: str, data_dir: pathlib.Path, reporter: Reporter, kill_grace: float = 5.0,
                 isolation: fence.Isolation | None = None, fake_gpus: int = 0):  # fmt: skip
        self.node, self.reporter, self.kill_grace = node, reporter, kill_grace
        self.data_dir = data_dir
        self.isolation = isolation if isolation is not None else fence.detect(node)
        self.limits = self.isolation.settings
        self.agent_dir = data_dir / "agents" / node
        # Which cgroups and uid leases are this agent's (and its restarts'): its node and its
        # data dir, so two agents that share a node name on one host (test runs, a mistake)
        # never take each other's jobs for orphans.
        self.instance = hashlib.sha1(str(data_dir.resolve()).encode()).hexdigest()[:8]
        self.holder = f"{node}@{self.instance}"
        self.state_file = self.agent_dir / "runs.json"
        self._saved_groups: list[int] | None = None  # what state_file holds (None: not written yet)
        self._tighten_data_dir()
        self.python_dir = jobenv.make_python_dir(data_dir)  # `python` on every job's PATH
        self.device_dir = self._device_dir(fake_gpus)
        self.runs: dict[tuple[int, int], Run] = {}
        from workers.prepare import Preparer

        self.preparer = Preparer(data_dir)
        self.reaping: list[Run] = []  # ended, their cgroup still emptying: uid not yet free
        # Members whose end was reported: a late start message (redelivered after a broker
        # restart) or a heartbeat answer read before that report would otherwise run them again.
        self.ended: dict[tuple[int, int], None] = {}
        self.lock = threading.RLock()
        self.reaper: reaper.Reaper | None = None
        self.ports: ports.PortLeases | None = None  # MASTER_PORT leases, made on first use
        self._spawn_requests: queue.Queue = queue.Queue()
        # Forks the fenced jobs (workers/forkserver.py): started by the launcher thread, whose
        # end (the agent's) its parent-death signal follows.
        self._forks: ForkServer | None = None
        # The fork server's spare and its cgroups, for the next fenced member (_ready_spare).
        self._spare: tuple[ForkServer, fence.JobCgroup] | None = None
        # Set when a run may have ended (its log pipe closed) or its start was answered: the
        # agent's tick loop then ticks at once rather than at its next beat, so a short job's
        # end is reported without waiting out the beat.
        self.woken = threading.Event()
        self._launcher = threading.Thread(target=self._launch_loop, name="launcher", daemon=True)
        self._launcher.start()
        fence.warn_if_unfenced(self.isolation, node)
        if self.isolation.jailed:
            atexit.register(self._kill_groups_at_exit)

    def start_reaper(self) -> reaper.Reaper | None:
        """The agent's reaper (workers/reaper.py): kills this agent's job cgroups once the agent
        is gone, however it ended, so a SIGKILLed agent's jobs leave no descendant even when no
        agent of the node starts again. None where jobs have no cgroups."""
        if self.isolation.cgroups is None:
            return None
        self.reaper = reaper.start(self.isolation.cgroups, prefix=f"{self.instance}.")
        return self.reaper

    def _tighten_data_dir(self) -> None:
        """The agent's data dir (state, logs, credentials, other jobs' dirs) is the agent's alone."""
        self.agent_dir.mkdir(parents=True, exist_ok=True)
        for path in (self.data_dir, self.data_dir / "agents", self.agent_dir):
            path.chmod(0o700)

    def _device_dir(self, fake_gpus: int) -> pathlib.Path:
        """Where this node's GPU device files are: /dev, or the agent's fake ones for `--fake`."""
        if fake_gpus:
            fence.make_fake_devices(self.data_dir / "dev", fake_gpus)
            return self.data_dir / "dev"
        return (
            pathlib.Path("/dev")
            if fence.gpu_device_files(pathlib.Path("/dev"))
            else self.data_dir / "dev"
        )

    @property
    def fake_devices(self) -> bool:
        return self.device_dir != pathlib.Path("/dev")

    # --- commands -------------------------------------------------------------------------

    def launch(self, assignment: Assignment) -> bool:
        """Start this member unless it already runs here (messages may arrive twice)."""
        key = (assignment.attempt_id, assignment.rank)
        with self.lock:
            if key in self.ended:
                log.info("attempt %s rank %s already ran here; not starting it again", *key)
                return False
            if key in self.runs or not assignment.active or assignment.stop_requested:
                return False
            member = f"attempt-{assignment.attempt_number}-rank-{assignment.rank}"
            run = Run(assignment=assignment, workdir=self.data_dir / "work" / assignment.job_id / member,
                      log_path=self.data_dir / "logs" / assignment.job_id / f"{member}.log",
                      checkpoint_dir=self._checkpoint_dir(assignment))  # fmt: skip
            self.runs[key] = run
        if assignment.rank == 0:
            self._lease_port(run)
            if run.launch_error:
                return True  # the next tick reports it
        done = threading.Event()
        if self.preparer.needed(assignment):
            # Fetching, unpacking, building an environment may take minutes: on a thread of its
            # own, never the launcher's (every other member's start waits for it) nor the
            # caller's (the agent's sync, which stops other members).
            threading.Thread(target=self._prepare_then_spawn, args=(run, done), daemon=True,
                             name=f"prepare-{key}").start()  # fmt: skip
            return True
        self._spawn_requests.put((run, done))
        done.wait(30)
        return True

    def _lease_port(self, run: Run) -> None:
        """Rank 0 listens on MASTER_PORT: a port of this host's, free, for as long as it runs."""
        try:
            if self.ports is None:
                self.ports = ports.PortLeases()
            run.master_port = self.ports.lease()
        except (ports.NoFreePort, OSError, ValueError) as error:  # none free; a bad setting
            log.error("attempt %s rank %s: %s", *run.key, error)
            run.failure, run.launch_error = "lost", str(error)  # retried, on this node or another

    def _prepare_then_spawn(self, run: Run, done: threading.Event) -> None:
        if self.preparer.prepare(self, run):
            self._spawn_requests.put((run, done))

    def _group_name(self, assignment: Assignment) -> str:
        return f"{self.instance}.{assignment.attempt_id}-{assignment.rank}"

    def _checkpoint_dir(self, assignment: Assignment) -> pathlib.Path:
        """Survives attempts; one per rank, since each rank is its own uid."""
        name = (
            assignment.job_id
            if assignment.rank == 0
            else f"{assignment.job_id}-rank-{assignment.rank}"
        )
        return self.data_dir / "checkpoints" / name

    def stop(self, attempt_id: int, rank: int, why: str) -> None:
        """Stop a member: SIGTERM, then SIGKILL after the kill grace. A preemption first sends
        the checkpoint signal and waits the tier's grace period for the job to save and exit."""
        with self.lock:
            run = self.runs.get((attempt_id, rank))
            if not run or run.finished or run.stop_reason:
                return
            if why == StopReason.SHELL_EXITED and getattr(run.assignment, "interactive", False):
                from workers.sessions import end_hold  # an interactive gang's other rank: exit 0

                end_hold(run, 0)
                return
            run.stop_reason = why or "stop"
            plan: list[tuple[int, float | None]] = [
                (signal.SIGTERM, self.kill_grace),
                (signal.SIGKILL, None),
            ]
            if why == StopReason.PREEMPT:
                checkpoint_signal = getattr(
                    signal, run.assignment.checkpoint_signal, signal.SIGUSR1
                )
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

    def kill_everything(self, why: str) -> None:
        """SIGKILL every job and, where fenced, all of its cgroup now, and free their cgroups and
        uids: for an agent that exits with os._exit, which skips the atexit hook doing this."""
        self.kill_all(why)
        if self.isolation.jailed:
            self._kill_groups_at_exit()

    def stop_all(self, why: str) -> None:
        with self.lock:
            keys = list(self.runs)
        for attempt_id, rank in keys:
            self.stop(attempt_id, rank, why)

    # --- the loop ---------------------------------------------------------------------------

    def tick(self) -> None:
        """Poll every run: exits, runtime limits, size caps, kill deadlines, progress, logs."""
        with self.lock:
            runs = list(self.runs.values())
        now = time.monotonic()
        for run in runs:
            if run.finished:
                continue
            if run.launch_error:
                self._kill_tree(run)
                self._finish(run, exit_code=127, reason=run.launch_error)
                continue
            if run.process is None or not run.started:
                continue  # not spawned yet (a member reported started as it was prepared)
            if not run.start_reported and not run.extra.get("start_queued"):
                continue  # its end goes only after its start
            code = run.process.poll()
            if code is not None:
                self._kill_tree(run)  # leftovers of the tree die with the job
                self._finish(run, exit_code=code, reason=self._reason(run, code))
                continue
            limit = run.assignment.max_runtime_seconds
            if not run.stop_reason and now - run.started > limit:
                log.info("attempt %s rank %s passed its max runtime %ss", *run.key, limit)
                self.stop(*run.key, why=StopReason.TIMEOUT)
            self._check_output_size(run, now)
            if run.over_limit and not run.stop_reason:
                log.warning("attempt %s rank %s: %s; stopping it", *run.key, run.over_limit)
                self.stop(*run.key, why=run.over_limit)
            if run.stop_deadline is not None and now > run.stop_deadline and run.stop_plan:
                self._next_stop_signal(run)
            self._report_progress(run)
            self._sync_log(run)
        self._reap()
        self._spare_when_idle()

    def _reason(self, run: Run, code: int) -> str:
        if run.stop_reason == StopReason.TIMEOUT:
            return EndReason.TIMEOUT
        if run.stop_reason:
            return run.stop_reason
        return (
            "" if code == 0 else (f"killed by signal {-code}" if code < 0 else f"exit code {code}")
        )

    def _finish(self, run: Run, *, exit_code: int | None, reason: str) -> None:
        run.finished, run.exit_code = True, exit_code
        if run.log_reader is not None:
            run.log_reader.join(
                2
            )  # the last lines, before the last sync (a leftover may hold the pipe)
        self._report_progress(run)
        self._sync_log(run, force=True)
        if exit_code == 0 and not run.stop_reason:
            joblog.collect_outputs(run, self.reporter)
        checkpoint = joblog.checkpoint_path(run)
        later = getattr(self.reporter, "finished_later", None)
        try:
            if later is not None:
                # Answered from the reporter's thread, batched with other members' reports: the
                # tick goes on to the next run meanwhile (it skips this one: finished is set).
                later(
                    run,
                    exit_code,
                    reason,
                    checkpoint,
                    lambda _, error: self._end_reported(run, error),
                )
                return
            self.reporter.finished(run, exit_code, reason, checkpoint)
        except Exception as error:
            self._end_reported(run, error)
            return
        self._end_reported(run, None)

    def _end_reported(self, run: Run, error: Exception | None) -> None:
        if error is not None:
            log.error("could not report the end of %s (%s); will retry", run.key, error)
            run.finished = False
            return
        self.preparer.release(run)
        if run.master_port and run.assignment.rank == 0 and self.ports is not None:
            self.ports.release(run.master_port)
        with self.lock:
            self.runs.pop(run.key, None)
            self._remember_ended(run.key)
            self._save_state()
            if run.cgroup is not None or run.uid is not None:
                self.reaping.append(run)
        self._reap()

    def _remember_ended(self, key: tuple[int, int]) -> None:
        """An attempt's member runs once per agent: the platform never places it here again."""
        self.ended[key] = None
        while len(self.ended) > ENDED_REMEMBERED:
            del self.ended[next(iter(self.ended))]  # the oldest: its attempt ended long ago

    def _reap(self) -> None:
        """Remove ended members' cgroups once empty, and only then give their uid back."""
        with self.lock:
            pending, self.reaping = self.reaping, []
        for run in pending:
            if run.cgroup is not None:
                # The tick killed the tree at the exit: most groups are empty by now, and one
                # that is not (a process still dying, a fork in flight) is killed again.
                if not run.cgroup.remove():
                    run.cgroup.kill()
                    with self.lock:
                        self.reaping.append(run)
                    continue
                run.cgroup = None
            if run.uid is not None and self.isolation.uids is not None:
                self.isolation.uids.release(run.uid)
                run.uid = None

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
        assert run.checkpoint_dir is not None  # launch() gives every member one
        if run.stop_reason:  # stopped (or fenced) while it was being prepared
            run.launch_error = f"stopped before it started: {run.stop_reason}"
            return
        output, control = run.workdir / "output", run.workdir / ".gpuplatform"
        for path in (output, control, run.workdir / "tmp", run.checkpoint_dir):
            path.mkdir(parents=True, exist_ok=True)
        run.log_path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        resume = self._resume_from(run)
        argv = jobenv.argv(run)
        env = jobenv.environment(
            run, node=self.node, python_dir=self.python_dir, output=output, control=control, resume=resume,
            visible_devices=self._visible_devices(a.gpu_indices),
            device_dir=self.device_dir if self.fake_devices else None,
        )  # fmt: skip
        argv, env = images.for_job(run, argv, env)  # an image's own (docs/images.md)
        # A job with dependencies: their artifacts, fetched before it starts (workers/inputs.py).
        if getattr(a, "inputs", False):
            self.reporter.fetch_inputs(run, control / "inputs")
            env["GPUPLATFORM_INPUT_DIR"] = str(control / "inputs")
        log_read, log_write = os.pipe()
        try:
            if self.isolation.jailed:
                self._spawn_fenced(run, argv, env, log_write)
            else:
                run.process = subprocess.Popen(  # noqa: S603 (argv list, no shell, by design)
                    argv, cwd=run.workdir, env=env, stdin=subprocess.DEVNULL, stdout=log_write,
                    stderr=log_write, start_new_session=True, preexec_fn=_die_with_parent,
                )  # fmt: skip
        except BaseException:
            os.close(log_read)
            raise
        finally:
            os.close(log_write)
        joblog.start_log_reader(run, log_read, self.limits.max_log_bytes, self.woken)
        run.started = time.monotonic()
        with self.lock:
            self._save_state()
        if run.launch_error:
            return
        assert run.process is not None  # spawned above, or launch_error says why not
        log.info("started attempt %s rank %s pid %s on GPUs %s", a.attempt_id, a.rank, run.process.pid, a.gpu_indices,
                 extra={"job_id": a.job_id, "attempt_id": a.attempt_id, "node": self.node, "rank": a.rank})  # fmt: skip
        if run.start_reported:
            return  # reported before it was prepared (workers/prepare.py)
        later = getattr(self.reporter, "started_later", None)
        if later is not None:
            # Answered from the reporter's thread (batched with other members' reports): the
            # launcher spawns the next member meanwhile. The end waits for this answer, unless
            # the reporter sends a member's reports in the order made (then a quick job's end
            # may go in the same call as its start).
            later(run, lambda accepted, error: self._start_reported(run, accepted, error))
            if getattr(self.reporter, "reports_in_order", False):
                run.extra["start_queued"] = True
            return
        try:
            accepted = self.reporter.started(run)
        except Exception as error:
            self._start_reported(run, None, error)
            return
        self._start_reported(run, accepted, None)

    def _start_reported(self, run: Run, accepted: bool | None, error: Exception | None) -> None:
        a = run.assignment
        if error is not None:
            # The process runs: its end is still reported (and settles the attempt); never
            # report it finished while it runs, or its GPUs would go to another job.
            log.error(
                "could not report the start of attempt %s rank %s (%s)", a.attempt_id, a.rank, error
            )
        run.start_reported = True
        self.woken.set()  # its end may already be there to see
        if accepted is False:
            # The attempt ended (lost, cancelled) between our read and the launch: stop it now
            # rather than at the next sync, so it never runs beside the job's next attempt.
            log.warning(
                "attempt %s rank %s ended before its process started; stopping it",
                a.attempt_id,
                a.rank,
            )
            self.stop(a.attempt_id, a.rank, why=UNASSIGNED)

    def _resume_from(self, run: Run) -> str:
        """The checkpoint the job resumes from: fetched by the reporter into the job's checkpoint
        dir where it can, else the one the platform recorded, if it is here."""
        a = run.assignment
        assert run.checkpoint_dir is not None
        fetch = getattr(self.reporter, "fetch_checkpoint", None)
        if fetch is not None:
            resume = fetch(run, run.checkpoint_dir) or ""
        else:
            resume = a.checkpoint if a.checkpoint and os.path.exists(a.checkpoint) else ""
        if not resume and (run.checkpoint_dir / "checkpoint.json").exists():
            resume = str(run.checkpoint_dir / "checkpoint.json")
        return resume

    def _visible_devices(self, indices: list[int]) -> str:
        """Behind a device fence CUDA numbers only the GPUs it can open, from 0 (as under
        Slurm's ConstrainDevices); fake GPUs and unfenced jobs keep the node's numbers."""
        if self.isolation.jailed and not self.fake_devices:
            return ",".join(str(i) for i in range(len(indices)))
        return ",".join(str(i) for i in indices)

    # --- the fence ------------------------------------------------------------------------------

    def _spawn_fenced(self, run: Run, argv: list[str], env: dict[str, str], log_write: int) -> None:
        """Lease a uid, hand it the member's dirs, make its cgroup, and start the job through
        the fence (workers/jail.py `enter`, run in the child the fork server forks, before the
        exec): the launch returns once the job is exec'd, or raises saying why not."""
        a = run.assignment
        # A jailed isolation has both (workers/isolation.py detect()); launch() set the dir.
        assert self.isolation.uids is not None and self.isolation.cgroups is not None
        assert run.checkpoint_dir is not None
        run.uid = self.isolation.uids.lease(node=self.holder, member=f"{a.attempt_id}-{a.rank}")
        for root in (run.workdir, run.checkpoint_dir):
            _give(root, run.uid)
        own, others = self._gpu_files(a.gpu_indices)
        deny = [device for device in map(fence.char_device, others.values()) if device]
        limits = fence.Limits.of(a, self.limits)
        forks = self._fork_server()
        run.cgroup = self._job_cgroup(forks, a, limits, deny)
        spec = {
            # The job's parent is the fork server: the fence checks that one is still there.
            "cwd": str(run.workdir), "uid": run.uid, "gid": run.uid,
            "agent_pid": forks.pid, "cgroup_procs": run.cgroup.procs_files,
            "expose": [str(p) for p in self._job_paths(run, own)],
            "private": list(fence.PRIVATE_DIRS),
            "hide": [] if self.fake_devices else [str(p) for p in others.values()],
            "tmp_size": f"{limits.memory_mib}m" if limits.memory_mib else "50%",
        }  # fmt: skip
        images.fence(run, spec, own)  # an image's root as its / (workers/image_root.py)
        # The job's environment (its secrets too) goes to the exec from memory, over the fork
        # server's socket: never on disk, never argv, where `ps` would show it.
        try:
            run.process = forks.launch(argv, env, spec, log_write)
        except LaunchFailed as error:  # a fence step or the exec failed: the server said why
            run.launch_error = f"could not start: {error}"[:300]

    def _job_cgroup(self, forks: ForkServer, a: Assignment, limits: fence.Limits,
                    deny: list[tuple[int, int]]) -> fence.JobCgroup:  # fmt: skip
        """The spare's groups, given the member's limits (the fork server hands the job to the
        process already in them), else fresh ones named for the member."""
        assert self.isolation.cgroups is not None
        with self.lock:
            spare, self._spare = self._spare, None
        if spare is not None and spare[0] is forks:
            try:
                self.isolation.cgroups.limit(spare[1], limits, deny_devices=deny)
                return spare[1]
            except OSError as error:  # removed under us (a leftover sweep): not the job's fault
                log.warning("the spare's cgroups are unusable (%s); starting without it", error)
        if spare is not None:
            self._discard(spare[1])
        return self.isolation.cgroups.create(self._group_name(a), limits, deny_devices=deny)

    def _spare_when_idle(self) -> None:
        """On an idle node (nothing runs or is being reaped here), a spare waits for the next
        fenced member: its start then skips the fork and the cgroup move, which after a quiet
        spell waits for an RCU grace period (workers/forkserver.py). None while members run: a
        waiting process shares the fork server's pages copy-on-write, which in a drain cost the
        agents ~10% more CPU a job (docs/bench/71-slurm-peer-notes.md), and there moves come
        close together and cost little. Off with GPUPLATFORM_SPARE_LAUNCHER=0."""
        forks = self._forks
        if forks is None or self._spare is not None or not self.limits.spare_launcher:
            return  # the fork server starts with the first fenced member (the launcher's)
        with self.lock:
            if self.runs or self.reaping:
                return
        self._ready_spare(forks)

    def _ready_spare(self, forks: ForkServer) -> None:
        if not forks.alive():
            return
        assert self.isolation.cgroups is not None
        try:
            group = self.isolation.cgroups.create(f"{self.instance}{SPARE_NAME}{uuid.uuid4().hex[:8]}",
                                                  None, deny_devices=[])  # fmt: skip
            forks.spare(group.procs_files)
        except OSError as error:
            log.warning("could not ready a spare launcher: %s", error)
            return
        with self.lock:
            self._spare = (forks, group)

    def _discard(self, group: fence.JobCgroup) -> None:
        group.kill()
        if group.paths:
            fence.wait_empty(group.paths[0], timeout=2.0)
        group.remove()

    def _group_names_in_use(self) -> set[str]:
        """The cgroups of the members here and of the spare: never leftovers."""
        with self.lock:
            groups = [run.cgroup for run in self.runs.values() if run.cgroup is not None]
            if self._spare is not None:
                groups.append(self._spare[1])
            names = {self._group_name(run.assignment) for run in self.runs.values()}
        return names | {group.paths[0].name for group in groups if group.paths}

    def _fork_server(self) -> ForkServer:
        """The fork server, started on first use (again if it died: its jobs died with it)."""
        if self._forks is None or not self._forks.alive():
            self._forks = ForkServer(on_exit=self.woken.set)
        return self._forks

    def _gpu_files(self, indices: list[int]) -> tuple[list[pathlib.Path], dict[int, pathlib.Path]]:
        files = fence.gpu_device_files(self.device_dir)
        own = [files[i] for i in indices if i in files]
        return own, {i: path for i, path in files.items() if i not in indices}

    def _job_paths(self, run: Run, own_gpus: list[pathlib.Path]) -> list[pathlib.Path]:
        """What the job must reach where the agent sees it: its dirs, the SDK, the interpreter
        the platform's `{python}` stands for, and its own GPUs' device files. Never a path the
        job names (its argv): that would bind back whatever a cover hides."""
        assert run.checkpoint_dir is not None
        paths = [run.workdir, run.checkpoint_dir, SDK_DIR, self.python_dir, *own_gpus]
        if run.env_dir is not None:
            paths.append(run.env_dir)  # read-only for every job (workers/envs.py)
        return paths + list(INTERPRETER_DIRS)

    def _kill_tree(self, run: Run) -> None:
        """Every process of the job: its cgroup where fenced, else its process group."""
        if run.cgroup is not None:
            run.cgroup.kill()
        self._kill_group(run, signal.SIGKILL)

    def _kill_groups_at_exit(self) -> None:
        """The agent is exiting: nothing it started may outlive it."""
        with self.lock:
            runs = list(self.runs.values()) + list(self.reaping)
            spare, self._spare = self._spare, None
        if spare is not None:
            self._discard(spare[1])
        for run in runs:
            if run.cgroup is not None:
                run.cgroup.kill()
        for run in runs:  # then tidy up, so the uids are free for the next agent at once
            if run.cgroup is not None and run.cgroup.paths:
                fence.wait_empty(run.cgroup.paths[0], timeout=2.0)
                if run.cgroup.remove() and run.uid is not None and self.isolation.uids is not None:
                    self.isolation.uids.release(run.uid)
        fence.remove_node_groups(self.isolation.cgroups)  # where no job group is left in them

    # --- signals and orphans ------------------------------------------------------------------

    def _signal(self, run: Run, signum: int) -> None:
        if signum == signal.SIGKILL and run.cgroup is not None:
            run.cgroup.kill()  # setsid'd and double-forked descendants too
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
        """Remember our process groups so a restarted agent can kill what the dead one left
        (fenced members are found by their cgroups instead). Written only when the list changed:
        where every member is fenced it stays empty, and a job's start or end writes nothing."""
        groups = [
            run.process.pid
            for run in self.runs.values()
            if run.process is not None and run.cgroup is None
        ]
        if groups == self._saved_groups:
            return
        self.state_file.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.state_file.with_suffix(".tmp")
        tmp.write_text(json.dumps({"process_groups": groups}))
        os.replace(tmp, self.state_file)
        self._saved_groups = groups

    def kill_orphans(self) -> int:
        """Kill what an earlier agent of this node left: the cgroups of its fenced members
        (every descendant, however it forked), and its unfenced process groups (checked by
        environ); then give back the uids it leased."""
        killed = self._kill_orphan_cgroups() + self._kill_orphan_groups()
        if killed:
            log.warning("killed %d orphaned job(s) from a previous agent", killed)
        return killed

    def _kill_orphan_cgroups(self) -> int:
        if self.isolation.cgroups is None:
            return 0
        keep = self._group_names_in_use()
        with self.lock:
            live_uids = {
                run.uid for run in list(self.runs.values()) + self.reaping if run.uid is not None
            }
        killed = 0
        for group in self.isolation.cgroups.leftovers(keep, prefix=f"{self.instance}."):
            if group.pids() and SPARE_NAME not in group.paths[0].name:  # a spare is no job
                killed += 1
            group.kill()
            fence.wait_empty(group.v2 or next(iter(group.v1.values())))
            if not group.remove():
                log.warning("a leftover job cgroup would not empty: %s", group.paths)
        if self.isolation.uids is not None:  # always, beside cgroups (detect())
            self.isolation.uids.release_node(self.holder, keep=live_uids)
        return killed

    def _kill_orphan_groups(self) -> int:
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
        self._saved_groups = None
        return killed

    def _belongs_to_us(self, pid: int) -> bool:
        try:
            environ = pathlib.Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        except OSError:
            return False
        return f"GPUPLATFORM_NODE={self.node}".encode() in environ

    # --- the log, progress, outputs ------------------------------------------------------------

    def _check_output_size(self, run: Run, now: float) -> None:
        if run.over_limit or now - run.output_checked < OUTPUT_CHECK_SECONDS:
            return
        run.output_checked = now
        if joblog.output_over(run, self.limits.max_output_bytes):
            run.over_limit = f"output over {self.limits.max_output_bytes} bytes"

    def _report_progress(self, run: Run) -> None:
        if run.assignment.rank != 0:
            self._store_checkpoint(run)
            return
        progress = joblog.read_control(run, "progress.json").get("progress")
        if progress is None:
            return  # nothing to report: its checkpoint marker is not read either
        checkpoint = joblog.checkpoint_path(run)
        current = (progress, checkpoint)
        if current == run.reported_progress:
            return
        try:
            self.reporter.progress(run, float(progress), checkpoint)
            run.reported_progress = current
        except Exception:
            log.warning("progress report failed for %s", run.key, exc_info=True)

    def _store_checkpoint(self, run: Run) -> None:
        """A gang's other ranks report no progress, but their checkpoints are stored as they
        save them (not only at their end): a member lost with its node still resumes."""
        marker = joblog.read_control(run, "checkpoint.json")
        saved = (marker.get("path"), marker.get("at"))
        store = getattr(self.reporter, "store_checkpoint", None)  # tests' reporters may lack it
        if store is None or not saved[0] or saved == run.reported_progress:
            return
        try:
            store(run, str(saved[0]))
            run.reported_progress = saved
        except Exception:
            log.warning("checkpoint upload failed for %s", run.key, exc_info=True)

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


def _give(root: pathlib.Path, uid: int) -> None:
    """Make a dir tree the job's, 0700. Files with more than one link are left alone: a hard
    link planted there must never hand the job the file it points to."""
    root.chmod(0o700)
    os.chown(root, uid, uid)
    for directory, dirnames, filenames in os.walk(root, followlinks=False):
        for name in dirnames + filenames:
            path = os.path.join(directory, name)
            info = os.lstat(path)
            if stat.S_ISDIR(info.st_mode):
                os.chown(path, uid, uid, follow_symlinks=False)
                os.chmod(path, 0o700)
            elif stat.S_ISREG(info.st_mode) and info.st_nlink == 1:
                os.chown(path, uid, uid, follow_symlinks=False)
