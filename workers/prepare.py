"""Before a member's process starts: its secrets, its code bundle and its Python environment
(docs/own-code.md). Pure Python, no Django.

In order: the secrets' values are fetched through the agent API (kept in memory only: the job's
environment and the log masker); the bundle comes from the node's cache (workers/bundles.py),
fetched there once, and is unpacked safely into the member's work dir (workers/unpack.py); the
environment is built or reused (workers/envs.py). What happens goes at the head of the job's
log, one line a step (`gpuplatform: bundle <sha12> cached` / `fetched (N bytes)`,
`gpuplatform: environment <digest12> reused`, or the build's own output).

The member is reported started (pid 0) before it is prepared, so that its attempt's lease is
renewed by the node's heartbeats while an environment builds; its max runtime counts from its
process's start. A step the job's own input breaks (a refused bundle, a requirement that does not
resolve, a deleted secret) ends the attempt `failed`, not retried, with a reason naming the step
and the member (`bundle: member 1: entry '../x' leaves the work dir`); one the platform or the
network breaks (a 5xx, a timeout) is reported lost, and the platform retries it.
"""

from __future__ import annotations

import logging
import os
import pathlib
import threading
import time
from typing import TYPE_CHECKING, BinaryIO

from apps.platform.agent_protocol import Assignment
from apps.platform.names import StopReason
from workers import envs, images, unpack
from workers.agent_client import ApiError
from workers.bundles import BundleCache, FetchError, Lease
from workers.masking import MIN_MASKED

if TYPE_CHECKING:
    from workers.runner import Run, Runner

log = logging.getLogger(__name__)
FINAL, LOST, STOPPED = "final", "lost", ""  # how a member that never ran is reported
LEADER_PORT_WAIT = float(os.environ.get("GPUPLATFORM_LEADER_PORT_WAIT", "600"))


def _waits_for_leader(a: Assignment) -> bool:
    """A gang member other than rank 0 whose MASTER_PORT the platform does not know yet."""
    return a.rank > 0 and a.world_size > 1 and not a.master_port


class Failed(Exception):
    def __init__(self, reason: str, kind: str = FINAL):
        super().__init__(reason)
        self.reason, self.kind = reason[:300], kind


class Preparer:
    def __init__(self, data_dir: pathlib.Path):
        self.data_dir = data_dir
        self._bundles: BundleCache | None = None
        self._envs: envs.EnvCache | None = None
        self._images: images.ImageCache | None = None
        # The caches are made at first use, from the members' prepare threads at once: one lock,
        # so there is one of each (two image caches would each keep their own cap and count).
        self._made = threading.Lock()
        self.caps = unpack.Caps.from_env()

    @property
    def bundles(self) -> BundleCache:
        with self._made:
            if self._bundles is None:
                self._bundles = BundleCache(self.data_dir / "bundles")
            return self._bundles

    @property
    def envs(self) -> envs.EnvCache:
        with self._made:
            if self._envs is None:
                self._envs = envs.EnvCache(self.data_dir / "envs")
            return self._envs

    @property
    def images(self) -> images.ImageCache:
        with self._made:
            if self._images is None:
                self._images = images.ImageCache(self.data_dir / "images")
            return self._images

    @staticmethod
    def needed(a: Assignment) -> bool:
        # getattr: the runner's own tests hand it assignments of older shapes
        fields = ("bundle", "secrets", "python_requirements", "image")
        if any(getattr(a, name, None) for name in fields):
            return True
        return _waits_for_leader(a)

    def prepare(self, runner: Runner, run: Run) -> bool:
        """True: spawn it. False: it ended here (run.launch_error and run.failure say how)."""
        a = run.assignment
        try:
            run.log_path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
            if not self._report_started(runner, run):
                return False
            flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC
            with os.fdopen(os.open(run.log_path, flags, 0o600), "ab") as head:
                if a.secrets:
                    self._secrets(runner, run, head)
                if a.bundle and not run.stop_reason:
                    self._bundle(runner, run, head)
                if getattr(a, "image", "") and not run.stop_reason:
                    self._image(runner, run, head)  # its own Python: no environment built
                elif not run.stop_reason:
                    self._environment(run, head)
            if _waits_for_leader(a) and not run.stop_reason:
                self._leader_port(runner, run)
        except Failed as failure:
            log.warning("attempt %s rank %s: %s", a.attempt_id, a.rank, failure.reason)
            run.failure, run.launch_error = failure.kind, failure.reason
            return False
        except Exception as error:  # noqa: BLE001 (the agent's own trouble: retried elsewhere)
            log.exception("attempt %s rank %s could not be prepared", a.attempt_id, a.rank)
            run.failure, run.launch_error = LOST, f"could not prepare: {error}"[:300]
            return False
        return True

    def _report_started(self, runner: Runner, run: Run) -> bool:
        try:
            accepted = runner.reporter.started(run)
        except Exception:
            log.exception("could not report the start of %s", run.key)
            accepted = None
        run.start_reported = True
        if accepted is False:
            log.warning("attempt %s rank %s ended before it was prepared", *run.key)
            run.stop_reason = StopReason.UNASSIGNED
            run.failure, run.launch_error = LOST, "ended before it started"
            return False
        return True

    # --- the steps ----------------------------------------------------------------------------

    def _leader_port(self, runner: Runner, run: Run) -> None:
        """A gang member other than rank 0 starts once rank 0's agent has leased MASTER_PORT
        (workers/ports.py) and the platform has it: rank 0 reports it with its start."""
        deadline = time.monotonic() + LEADER_PORT_WAIT
        while not run.stop_reason:
            try:
                port = runner.reporter.leader_port(run)
            except ApiError as error:
                log.warning("attempt %s rank %s: MASTER_PORT not read (%s)", *run.key, error)
                port = 0
            if port is None:
                raise Failed("no longer placed here while waiting for rank 0's MASTER_PORT", LOST)
            if port:
                run.master_port = port
                return
            if time.monotonic() > deadline:
                raise Failed(f"rank 0 gave no MASTER_PORT within {LEADER_PORT_WAIT:.0f}s", LOST)
            time.sleep(0.5)  # a read of the member's assignment: gentle with a large gang

    def _secrets(self, runner: Runner, run: Run, head: BinaryIO) -> None:
        a = run.assignment
        try:
            values = runner.reporter.secrets(run)
        except ApiError as error:
            if error.status in (409, 410):
                raise Failed(f"secrets: member {a.rank}: {_detail(error)}") from None
            raise Failed(f"secrets: member {a.rank}: could not fetch: {error}", LOST) from None
        missing = [name for name in a.secrets if name not in values]
        if missing:
            raise Failed(f"secrets: member {a.rank}: {', '.join(missing)} not available (deleted?)")
        run.secret_values = {name: values[name] for name in a.secrets}
        for name, value in run.secret_values.items():
            if 0 < len(value.encode()) < MIN_MASKED:
                head.write(f"gpuplatform: secret {name} is shorter than {MIN_MASKED} bytes: "
                           "it is not masked in this log\n".encode())  # fmt: skip

    def _bundle(self, runner: Runner, run: Run, head: BinaryIO) -> None:
        a = run.assignment
        began = time.monotonic()
        try:
            lease = self.bundles.acquire(a.bundle, lambda: runner.reporter.bundle_chunks(run))
        except FetchError as error:
            raise Failed(
                f"bundle: member {a.rank}: {error}", FINAL if error.final else LOST
            ) from None
        except ApiError as error:
            kind = FINAL if error.status == 404 else LOST
            raise Failed(
                f"bundle: member {a.rank}: could not fetch: {_detail(error)}", kind
            ) from None
        run.bundle_lease = lease
        fetched = time.monotonic()
        how = "cached" if lease.fetched is None else f"fetched ({lease.fetched} bytes)"
        head.write(f"gpuplatform: bundle {a.bundle[:12]} {how}\n".encode())
        head.flush()
        run.workdir.mkdir(parents=True, exist_ok=True)
        try:
            entries = unpack.unpack(lease.path, run.workdir, self.caps)
        except unpack.Refused as why:
            unpack.clear(run.workdir)
            raise Failed(f"bundle: member {a.rank}: {why}") from None
        head.write(f"gpuplatform: bundle unpacked: {entries} entries in {time.monotonic() - fetched:.2f}s "
                   f"(fetch {fetched - began:.2f}s)\n".encode())  # fmt: skip
        head.flush()

    def _environment(self, run: Run, head: BinaryIO) -> None:
        a = run.assignment
        listed = run.workdir / "requirements.txt"
        requirements: list[str] | None = None
        if a.python_requirements:
            requirements = list(a.python_requirements)
            if a.bundle and os.path.lexists(listed):
                head.write(b"gpuplatform: the submit body's python requirements are used; "
                           b"the bundle's requirements.txt is ignored\n")  # fmt: skip
        elif a.bundle and os.path.lexists(listed):
            try:
                requirements = envs.read_requirements_file(listed)
            except envs.EnvError as error:
                raise Failed(f"environment: {error}") from None
        if requirements is None:
            return
        try:
            wanted = envs.normalise(requirements)
            if not wanted:
                return
            env = self.envs.get(wanted, head, stopped=lambda: bool(run.stop_reason))
        except envs.EnvError as error:
            raise Failed(f"environment: {error}") from None
        except envs.Stopped:  # reported as its stop says (cancelled, preempted, lost)
            raise Failed(f"stopped before it started: {run.stop_reason}", STOPPED) from None
        run.env_dir = env.path

    def _image(self, runner: Runner, run: Run, head: BinaryIO) -> None:
        a = run.assignment
        try:
            images.prepare_member(
                self.images, runner.reporter, run, head, jailed=runner.isolation.jailed
            )
        except images.PullFailed as error:  # the job's own image: no retry (docs/images.md)
            raise Failed(f"image: member {a.rank}: {error.reason}") from None
        except ApiError as error:
            if error.status in (409, 410):  # its pull secret deleted or unreadable
                raise Failed(f"image: member {a.rank}: {_detail(error)}") from None
            raise Failed(f"image: member {a.rank}: {error}", LOST) from None

    def release(self, run: Run) -> None:
        images.release(run)  # its own layer, and its hold on its image
        lease = run.bundle_lease
        if isinstance(lease, Lease):
            lease.release()
        run.bundle_lease = None


def _detail(error: ApiError) -> str:
    """The platform's `detail`, where its answer was JSON with one; else the error's text."""
    import json

    text = str(error)
    _, _, body = text.partition(f": {error.status} ")
    try:
        detail = json.loads(body).get("detail")
    except (ValueError, AttributeError):
        detail = None
    return str(detail or text)[:200]
