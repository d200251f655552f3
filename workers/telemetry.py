"""GPU telemetry on the node (docs/telemetry.md): a sampler thread reads every GPU every
`interval` seconds (the register answer's `gpu_sample_seconds`, 10 s by default) and keeps the
samples until the next heartbeat carries them (no request per sample).

Each sample is attributed to the attempt member that holds the GPU (the runner's runs and their
`gpu_indices`); a GPU that nobody holds is sampled for the node's own view (the heartbeat's
`gpus`) but sends no sample. With NVML: its utilisation, memory used, power and temperature,
and XID / ECC errors as health (a GPU with either stays unhealthy until the agent restarts).
With `--fake`: a GPU's utilisation is its job's CPU use on this node (a busy process reads about
100, a sleeping one 0) and its memory the job's resident memory, read from the member's cgroup
where it has one, else from /proc for its session's processes. A file `fake-gpu-errors` in the
agent's data dir (lines `INDEX xid N` or `INDEX ecc N`) fakes an error on a fake GPU.

A sample carries `"active": true` when the member's interactive sessions (workers/sessions.py:
a shell, an exec or a forwarded port, on any rank) carried a byte either way during the seconds
it covers: the web's idle policy counts that GPU in use (typing keeps an interactive job alive).
"""

from __future__ import annotations

import collections
import logging
import os
import pathlib
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from apps.platform.agent_protocol import GpuInfo

if TYPE_CHECKING:
    from workers.gpus import Nvml
    from workers.runner import Run, Runner

log = logging.getLogger(__name__)
DEFAULT_INTERVAL = 10.0
MAX_PENDING = 5000  # samples kept while the web does not answer (the oldest go first)
TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096
MIB = 1 << 20
RESCAN_SECONDS = 5.0  # how often a fake GPU's reading looks for its job's new processes


@dataclass
class _Usage:
    """A member's CPU seconds and resident bytes at one moment (the fake GPUs' source)."""

    cpu_seconds: float
    rss_bytes: int
    at: float


class Sampler:
    def __init__(self, runner: Runner, *, gpus: list[GpuInfo], nvml: Nvml | None,
                 interval: float = DEFAULT_INTERVAL, errors_file: pathlib.Path | None = None,
                 activity: Callable[[tuple[int, int]], float | None] | None = None):  # fmt: skip
        self.runner, self.nvml, self.interval = runner, nvml, interval
        # (attempt, rank) -> seconds since its sessions' last byte, None if none (Sessions.quiet_for)
        self.activity = activity
        self.errors_file = errors_file
        self.inventory = {g.index: g for g in gpus}
        self.unhealthy: dict[int, str] = {}  # index -> "xid 79" / "ecc 2": sticky
        self.current: dict[int, GpuInfo] = dict(self.inventory)
        self._sent: dict[int, GpuInfo] = dict(self.inventory)  # as the platform last heard
        self._pending: collections.deque[dict] = collections.deque(maxlen=MAX_PENDING)
        self._lock = threading.Lock()
        self._usage: dict[tuple[int, int], _Usage | None] = {}  # by run key: the last reading
        self._sessions = SessionTable()  # the unfenced members' processes (fake GPUs)
        self._last: dict[tuple[int, int, int], float] = {}  # (attempt, rank, gpu) -> last sample t
        self._extra: dict[int, dict] = {}  # power and temperature by index, from the last NVML read
        # NVML's event set for critical XIDs, made at the first read (False: NVML has none here)
        self._xid_events: object = None
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None

    # --- the heartbeat's side -------------------------------------------------------------

    def take(self) -> tuple[list[GpuInfo], list[dict]]:
        """For the next heartbeat: the GPUs whose reading (health, utilisation, memory used)
        changed since the last one took them, and the samples taken since."""
        with self._lock:
            gpus = [g for i, g in sorted(self.current.items()) if self._sent.get(i) != g]
            self._sent.update((g.index, g) for g in gpus)
            samples = list(self._pending)
            self._pending.clear()
        return gpus, samples

    def put_back(self, gpus: list[GpuInfo], samples: list[dict]) -> None:
        """A heartbeat that failed: what it carried goes with the next one."""
        with self._lock:
            for gpu in gpus:
                self._sent.pop(gpu.index, None)
            newer = list(self._pending)
            self._pending.clear()
            self._pending.extend(samples)
            self._pending.extend(newer)

    # --- sampling ---------------------------------------------------------------------------

    def start(self) -> None:
        if self._thread is None and self.interval > 0:
            self._thread = threading.Thread(target=self._loop, name="gpu-telemetry", daemon=True)
            self._thread.start()

    def stop(self) -> None:
        self._stopping.set()

    def _loop(self) -> None:
        due = time.monotonic()
        while True:
            due = max(due + self.interval, time.monotonic())
            if self._stopping.wait(max(0.0, due - time.monotonic())):
                return
            try:
                self.sample()
            except Exception:
                log.exception("GPU sampling failed; trying again next interval")

    def sample(self, now: float | None = None) -> list[dict]:
        """Read every GPU once; queue (and return) the samples of the GPUs that jobs hold."""
        now = time.time() if now is None else now
        holders = self._holders()
        self._read_errors()
        readings = self._read_nvml() if self.nvml is not None else self._read_fake(holders, now)
        samples = []
        with self._lock:
            for index, info in readings.items():
                health = self.unhealthy.get(index, "")
                self.current[index] = replace(info, healthy=info.healthy and not health)
                holder = holders.get(index)
                if holder is None or info.utilization_percent is None:
                    continue
                key = (holder.assignment.attempt_id, holder.assignment.rank, index)
                seconds = min(now - self._last.get(key, now - self.interval), 3 * self.interval)
                self._last[key] = now
                sample: dict[str, object] = {
                    "t": round(now, 3), "index": index, "attempt_id": key[0], "rank": key[1],
                    "util": info.utilization_percent, "memory_mib": info.memory_used_mib or 0,
                    "seconds": round(max(0.0, seconds), 3),
                }  # fmt: skip
                extra = self._extra.get(index, {})
                sample.update(extra)
                if health:
                    sample["health"] = health
                if self._active(key[:2], seconds):
                    sample["active"] = True
                samples.append(sample)
            self._pending.extend(samples)
        live = {(r.assignment.attempt_id, r.assignment.rank) for r in holders.values()}
        for gone in [k for k in self._usage if k not in live]:
            del self._usage[gone]
        for old in [k for k in self._last if k[:2] not in live]:
            del self._last[old]
        return samples

    def _active(self, member: tuple[int, int], seconds: float) -> bool:
        """Whether the member's sessions carried a byte in the `seconds` just before now."""
        quiet = self.activity(member) if self.activity is not None else None
        return quiet is not None and quiet <= seconds

    def _holders(self) -> dict[int, Run]:
        with self.runner.lock:
            runs = [
                r for r in self.runner.runs.values() if not r.finished and r.process is not None
            ]
        return {index: run for run in runs for index in run.assignment.gpu_indices}

    def _read_errors(self) -> None:
        """Fake errors from the errors file (tests); NVML's are read in _read_nvml."""
        if self.errors_file is None or not self.errors_file.is_file():
            return
        for line in self.errors_file.read_text().splitlines():
            parts = line.split()
            if len(parts) == 3 and parts[0].isdigit() and parts[1] in ("xid", "ecc"):
                self._mark_unhealthy(int(parts[0]), f"{parts[1]} {parts[2]}")

    def _mark_unhealthy(self, index: int, why: str) -> None:
        if index in self.inventory and index not in self.unhealthy:
            log.error("GPU %d is unhealthy (%s): it takes no new work", index, why)
            self.unhealthy[index] = why

    # --- fake GPUs: the holder's CPU and memory ------------------------------------------------

    def _read_fake(self, holders: dict[int, Run], now: float) -> dict[int, GpuInfo]:
        readings = {}
        util_by_run: dict[tuple[int, int], tuple[int | None, int]] = {}
        runs = list({id(r): r for r in holders.values()}.values())
        # The members' processes by session, for those whose cgroup gives no reading (none, or
        # a hybrid host's v2 group without the controllers): one pass over /proc for all.
        sessions = self._sessions.usage({pid for r in runs if (pid := _session_of(r))}, now)
        for run in runs:
            key = (run.assignment.attempt_id, run.assignment.rank)
            usage = member_usage(run, now, sessions)
            before = self._usage.get(key)
            self._usage[key] = usage
            if usage is None:
                util_by_run[key] = (None, 0)
                continue
            util = None
            if before is not None and usage.at > before.at:
                busy = max(0.0, usage.cpu_seconds - before.cpu_seconds) / (usage.at - before.at)
                util = int(round(min(100.0, 100.0 * busy)))
            util_by_run[key] = (util, usage.rss_bytes // MIB)
        for index, info in self.inventory.items():
            holder = holders.get(index)
            if holder is None:
                readings[index] = replace(info, utilization_percent=0, memory_used_mib=0)
                continue
            util, memory = util_by_run[(holder.assignment.attempt_id, holder.assignment.rank)]
            readings[index] = replace(info, utilization_percent=util, memory_used_mib=memory)
        return readings

    # --- NVML -------------------------------------------------------------------------------

    def _read_nvml(self) -> dict[int, GpuInfo]:
        assert self.nvml is not None
        nv = self.nvml.nv
        extra = {}
        for index, xid in self._xids(nv):
            self._mark_unhealthy(index, f"xid {xid}")
        read = {g.index: g for g in self.nvml.gpus(limit=max(self.inventory, default=-1) + 1)}
        readings = {index: read[index] for index in self.inventory if index in read}
        for index in readings:
            try:
                handle = nv.nvmlDeviceGetHandleByIndex(index)
            except nv.NVMLError:
                continue
            extra[index] = {k: v for k, v in nvml_extras(nv, handle).items() if v is not None}
            errors = nvml_errors(nv, handle)
            if errors:
                self._mark_unhealthy(index, errors)
        self._extra = extra
        return readings

    def _xids(self, nv) -> list[tuple[int, int]]:
        """Critical XID events since the last read, as (GPU index, XID), without waiting."""
        if self._xid_events is None:
            try:
                self._xid_events = nv.nvmlEventSetCreate()
                for index in self.inventory:
                    handle = nv.nvmlDeviceGetHandleByIndex(index)
                    nv.nvmlDeviceRegisterEvents(
                        handle, nv.nvmlEventTypeXidCriticalError, self._xid_events
                    )
            except nv.NVMLError as error:
                log.warning("NVML gives no XID events here (%s); ECC errors only", error)
                self._xid_events = False
        if not self._xid_events:
            return []
        found: list[tuple[int, int]] = []
        uuids = {info.uuid: index for index, info in self.inventory.items()}
        while True:
            try:
                event = nv.nvmlEventSetWait(self._xid_events, 0)
            except nv.NVMLError:  # a timeout: none left
                return found
            uuid = nv.nvmlDeviceGetUUID(event.device)
            uuid = uuid.decode() if isinstance(uuid, bytes) else uuid
            if uuid in uuids:
                found.append((uuids[uuid], int(event.eventData)))


def nvml_extras(nv, handle) -> dict:
    """Power (W) and temperature (C), None where the GPU does not say."""
    out: dict[str, float | None] = {"power_w": None, "temperature_c": None}
    try:
        out["power_w"] = round(nv.nvmlDeviceGetPowerUsage(handle) / 1000.0, 1)
    except nv.NVMLError:
        pass
    try:
        out["temperature_c"] = nv.nvmlDeviceGetTemperature(handle, nv.NVML_TEMPERATURE_GPU)
    except nv.NVMLError:
        pass
    return out


def nvml_errors(nv, handle) -> str:
    """ "ecc N" for uncorrected volatile ECC errors; else "" (XIDs come from Sampler._xids)."""
    try:
        ecc = nv.nvmlDeviceGetTotalEccErrors(
            handle, nv.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, nv.NVML_VOLATILE_ECC
        )
        if ecc:
            return f"ecc {ecc}"
    except nv.NVMLError:
        pass  # no ECC on this GPU
    return ""


def member_usage(run: Run, now: float, sessions: dict[int, _Usage] | None = None) -> _Usage | None:
    """The member's CPU seconds and resident memory now: its cgroup's where it has one, else
    those of the processes of its session (the runner starts each member in its own), from
    `sessions` (SessionTable.usage) where given."""
    group = getattr(run.cgroup, "v2", None)
    if group is not None:
        try:
            return _cgroup_usage(pathlib.Path(group), now)
        except (OSError, ValueError):
            pass
    process = run.process
    if process is None or not getattr(process, "pid", None):
        return None
    if sessions is None:
        sessions = SessionTable().usage({process.pid}, now)
    return sessions.get(process.pid)


def _session_of(run: Run) -> int | None:
    """The member's session (the runner starts each member in its own)."""
    return getattr(run.process, "pid", None) or None


def _cgroup_usage(group: pathlib.Path, now: float) -> _Usage:
    stat = dict(line.split() for line in (group / "cpu.stat").read_text().splitlines() if line)
    memory = int((group / "memory.current").read_text())
    anon = _memory_stat(group).get("anon")
    return _Usage(int(stat["usage_usec"]) / 1e6, anon if anon is not None else memory, now)


def _memory_stat(group: pathlib.Path) -> dict[str, int]:
    try:
        lines = (group / "memory.stat").read_text().splitlines()
    except OSError:
        return {}
    return {k: int(v) for k, v in (line.split() for line in lines if line)}


class SessionTable:
    """The processes of each session asked about, read from /proc: a whole pass over /proc (to
    find new processes) when a session is new or RESCAN_SECONDS have passed, else only the
    processes found last time. A pass is hundreds of reads on a loaded node; on a 2-core machine
    a pass a member every 0.5 s took more CPU than the jobs it measured."""

    def __init__(self) -> None:
        self.pids: dict[int, set[int]] = {}  # session -> its processes at the last reading
        self.scanned = -RESCAN_SECONDS

    def usage(self, sessions: set[int], now: float) -> dict[int, _Usage]:
        if not sessions:
            return {}
        full = any(s not in self.pids for s in sessions)
        full = full or time.monotonic() - self.scanned >= RESCAN_SECONDS
        if full:
            self.scanned = time.monotonic()
            candidates = (int(name) for name in os.listdir("/proc") if name.isdigit())
        else:
            candidates = (pid for s in sessions for pid in self.pids[s])
        cpu: dict[int, int] = {}
        rss: dict[int, int] = {}
        found: dict[int, set[int]] = {s: set() for s in sessions}
        for pid in candidates:
            try:
                with open(f"/proc/{pid}/stat", "rb") as f:
                    stat = f.read()
            except OSError:
                continue
            fields = stat[stat.rfind(b")") + 2 :].split()
            # fields[0] is the state (stat's 3rd field): session is the 6th, utime/stime
            # 14th/15th, rss the 24th.
            session = int(fields[3])
            if session not in found:
                continue
            found[session].add(pid)
            cpu[session] = cpu.get(session, 0) + int(fields[11]) + int(fields[12])
            rss[session] = rss.get(session, 0) + int(fields[21]) * PAGE
        self.pids = found
        return {s: _Usage(cpu[s] / TICKS, rss[s], now) for s in cpu}
