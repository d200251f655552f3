"""What fences a job from the node and from other jobs, found once at agent start.

A root agent runs each attempt member as its own unprivileged uid (a pool the agent leases
from), in its own cgroup (memory, pids, CPU weight; killed whole) and its own mount namespace
(private /tmp, only its own dirs and GPU device files reachable); see workers/jail.py. An agent
that cannot (not root, no cgroups) runs jobs as itself and says so: `isolation: none`.
Pure Python, no Django: the agent imports it with nothing but its environment.
"""

from __future__ import annotations

import errno
import logging
import os
import pathlib
import re
import signal
import stat
import time
from dataclasses import dataclass, field

log = logging.getLogger(__name__)

NONE = "none"
JAILED = "uid+cgroup+mountns"
NVIDIA_MAJOR = (
    195  # the NVIDIA driver's char major: fake device files use it too, never /dev/null's
)
NVIDIA_CONTROL_MINORS = (254, 255)  # nvidia-modeset, nvidiactl: shared by every job, never denied
PRIVATE_DIRS = ("/tmp", "/var/tmp", "/dev/shm")  # world-writable on the host: a fresh tmpfs per job
CGROUP_ROOT = pathlib.Path("/sys/fs/cgroup")
V1_CONTROLLERS = ("memory", "pids", "cpu", "devices", "freezer")
V2_LIMIT_CONTROLLERS: tuple[str, ...] = ("memory", "pids", "cpu")
V2_LIMIT_FILES = {"memory": "memory.max", "pids": "pids.max", "cpu": "cpu.weight"}
STRICT = "strict"  # GPUPLATFORM_ISOLATION: every limit or no agent


# --- settings (from the environment: the agent has no Django) --------------------------------


def env_int(name: str, default: int, minimum: int = 0) -> int:
    raw = os.environ.get(name, "").strip()
    if not raw:
        return default
    try:
        value = int(raw)
    except ValueError:
        raise ValueError(f"{name} must be an integer, got {raw!r}") from None
    if value < minimum:
        raise ValueError(f"{name} must be at least {minimum}, got {value}")
    return value


@dataclass(frozen=True)
class Settings:
    max_log_bytes: int
    max_output_bytes: int
    uid_base: int
    uid_count: int
    memory_mib: int  # per member when the job asks for nothing; 0: no limit
    pids_max: int
    cpu_weight: int
    lease_dir: pathlib.Path
    # "auto": fence jobs where the agent can; "none": the operator turns fencing off on purpose;
    # "strict": fence every job with all its limits (memory, pids, cpu) or refuse to start.
    mode: str
    spare_launcher: bool = True  # GPUPLATFORM_SPARE_LAUNCHER (runner.py `_ready_spare`)

    @classmethod
    def from_env(cls) -> Settings:
        mode = os.environ.get("GPUPLATFORM_ISOLATION", "auto").strip() or "auto"
        if mode not in ("auto", NONE, STRICT):
            raise ValueError(
                f"GPUPLATFORM_ISOLATION must be 'auto', 'strict' or 'none', got {mode!r}"
            )
        return cls(
            max_log_bytes=env_int("GPUPLATFORM_MAX_LOG_BYTES", 100 * 2**20, minimum=1),
            max_output_bytes=env_int("GPUPLATFORM_MAX_OUTPUT_BYTES", 20 * 2**30, minimum=1),
            uid_base=env_int("GPUPLATFORM_JOB_UID_BASE", 3_000_000, minimum=1000),
            uid_count=env_int("GPUPLATFORM_JOB_UID_COUNT", 4096, minimum=1),
            memory_mib=env_int("GPUPLATFORM_JOB_MEMORY_MIB", 0),
            pids_max=env_int("GPUPLATFORM_JOB_PIDS_MAX", 4096, minimum=1),
            cpu_weight=env_int("GPUPLATFORM_JOB_CPU_WEIGHT", 100, minimum=1),
            lease_dir=pathlib.Path(
                os.environ.get("GPUPLATFORM_JOB_UID_LEASE_DIR") or "/run/gpuplatform/uids"
            ),
            mode=mode,
            # 1, the default: on an idle node a process waits, forked and in fresh cgroups, for
            # the next fenced member (its start skips the fork and the cgroup move:
            # workers/forkserver.py; a whole platform's placed-to-first-instruction 12-30 ms
            # shorter, docs/operations.md); 0: off.
            spare_launcher=bool(env_int("GPUPLATFORM_SPARE_LAUNCHER", 1)),
        )


@dataclass(frozen=True)
class Limits:
    memory_mib: int  # 0: none
    pids_max: int
    cpu_weight: int  # cgroup v2 scale, 1..10000, 100 the default

    @classmethod
    def of(cls, assignment, settings: Settings) -> Limits:
        """The job's request where the assignment carries one, else the node's default."""
        weight = getattr(assignment, "cpu_weight", 0) or settings.cpu_weight
        return cls(
            memory_mib=getattr(assignment, "memory_mib", 0) or settings.memory_mib,
            pids_max=getattr(assignment, "pids_max", 0) or settings.pids_max,
            cpu_weight=max(1, min(10000, weight)),
        )


# --- cgroups ------------------------------------------------------------------------------------


def _write(path: pathlib.Path, value: str) -> None:
    with open(path, "w") as handle:
        handle.write(value)


def _pids_in(group: pathlib.Path) -> set[int]:
    try:
        return {int(line) for line in (group / "cgroup.procs").read_text().split()}
    except (FileNotFoundError, ValueError):
        return set()


@dataclass
class JobCgroup:
    """One attempt member's groups: the v2 group (membership, cgroup.kill; on pure v2 also its
    limits) and on a hybrid host one v1 group per controller."""

    v2: pathlib.Path | None
    v1: dict[str, pathlib.Path] = field(default_factory=dict)

    @property
    def paths(self) -> list[pathlib.Path]:
        return ([self.v2] if self.v2 else []) + list(self.v1.values())

    @property
    def procs_files(self) -> list[str]:
        return [str(path / "cgroup.procs") for path in self.paths]

    def pids(self) -> set[int]:
        pids: set[int] = set()
        for path in self.paths:
            pids |= _pids_in(path)
        return pids

    def kill(self) -> None:
        """SIGKILL every process in the group, forks in flight included."""
        if self.v2 and (self.v2 / "cgroup.kill").exists():
            try:
                _write(self.v2 / "cgroup.kill", "1")
                return
            except FileNotFoundError:
                return
            except OSError:
                log.warning(
                    "cgroup.kill failed on %s; killing its processes one by one",
                    self.v2,
                    exc_info=True,
                )
        self._freeze_and_kill()

    def _freeze_and_kill(self) -> None:
        """Without cgroup.kill (v1 only, kernels before 5.14): freeze, kill every pid, thaw, so
        nothing forks between the list and the kill."""
        freezer = self.v1.get("freezer")
        frozen = False
        if freezer is not None:
            try:
                _write(freezer / "freezer.state", "FROZEN")
                frozen = True
            except OSError:
                pass
        for _ in range(3):
            pids = self.pids()
            for pid in pids:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            if not pids:
                break
        if frozen and freezer is not None:
            try:
                _write(freezer / "freezer.state", "THAWED")  # killed processes die only once thawed
            except OSError:
                pass

    def empty(self) -> bool:
        return not self.pids()

    def remove(self) -> bool:
        """rmdir every group once empty; False while some process is still dying."""
        for path in self.paths:
            try:
                path.rmdir()
            except FileNotFoundError:
                pass
            except OSError as error:
                if error.errno in (errno.EBUSY, errno.ENOTEMPTY):
                    return False
                raise
        return True


class Cgroups:
    """Where this node's job groups live: under the agent's own group in each hierarchy,
    `gpuplatform/<node>/<attempt>-<rank>`, so a restarted agent finds what its predecessor left."""

    def __init__(
        self, *, v2_base: pathlib.Path | None, v1_bases: dict[str, pathlib.Path], pure_v2: bool,
        v2_controllers: tuple[str, ...] = V2_LIMIT_CONTROLLERS,
    ):  # fmt: skip
        self.v2_base, self.v1_bases, self.pure_v2 = v2_base, v1_bases, pure_v2
        self.v2_controllers = v2_controllers  # pure v2: the limit controllers handed down to jobs

    @property
    def layout(self) -> str:
        return "cgroup v2" if self.pure_v2 else "hybrid (cgroup v2 membership and kill, v1 limits)"

    def create(
        self, name: str, limits: Limits | None, *, deny_devices: list[tuple[int, int]]
    ) -> JobCgroup:
        """A member's groups, limited; with `limits` None, not yet (the fork server's spare
        waits in them until `limit` gives them a job's)."""
        group = JobCgroup(v2=None)
        try:
            self._groups(group, name)
        except FileNotFoundError:  # another agent of this node name on this host removed them
            self._bases_again()
            self._groups(group, name)
        if limits is not None:
            try:
                self._limit(group, limits, deny_devices)
            except OSError:
                group.remove()
                raise
        return group

    def limit(
        self, group: JobCgroup, limits: Limits, *, deny_devices: list[tuple[int, int]]
    ) -> None:
        """Give groups made without limits (a spare's) a job's: before its exec, so the job never
        runs unlimited; OSError when they are gone (removed under us)."""
        self._limit(group, limits, deny_devices)

    def _groups(self, group: JobCgroup, name: str) -> None:
        if self.v2_base is not None:
            group.v2 = self._fresh(self.v2_base / name)
        for controller, base in self.v1_bases.items():
            group.v1[controller] = self._fresh(base / name)

    def _bases_again(self) -> None:
        """The node's groups made again where another agent of this node name on this host
        removed them as it exited (`remove_bases`), with the controllers handed on (pure v2) as
        `_delegate_v2` hands them."""
        if self.v2_base is not None and not self.v2_base.is_dir():
            self.v2_base.mkdir(exist_ok=True)
            if self.pure_v2 and self.v2_controllers:
                wanted = " ".join(f"+{name}" for name in self.v2_controllers)
                _write(self.v2_base / "cgroup.subtree_control", wanted)
        for base in self.v1_bases.values():
            base.mkdir(exist_ok=True)

    def _bases(self) -> list[pathlib.Path]:
        """The node's own groups, `gpuplatform/<node>` in each hierarchy."""
        return ([self.v2_base] if self.v2_base else []) + list(self.v1_bases.values())

    def _fresh(self, path: pathlib.Path) -> pathlib.Path:
        try:
            path.mkdir()
        except FileExistsError:  # a leftover with our name: its processes die with it
            JobCgroup(v2=path).kill()
            wait_empty(path)
            path.rmdir()
            path.mkdir()
        return path

    def _limit(self, group: JobCgroup, limits: Limits, deny_devices: list[tuple[int, int]]) -> None:
        memory = str(limits.memory_mib * 2**20) if limits.memory_mib else None
        if self.pure_v2:
            assert group.v2 is not None  # pure v2: create() made its v2 group
            # Only the controllers handed down (_delegate_v2): one the kernel lacks has no file.
            values = {"memory": memory, "pids": str(limits.pids_max), "cpu": str(limits.cpu_weight)}
            for name in self.v2_controllers:
                value = values[name]
                if value:  # no memory limit asked: memory.max stays "max"
                    _write(group.v2 / V2_LIMIT_FILES[name], value)
            if memory and "memory" in self.v2_controllers:
                _write_if_there(group.v2 / "memory.swap.max", "0")
            return  # device files: the mount namespace hides the others (no devices file in v2)
        if memory and "memory" in group.v1:
            _write(group.v1["memory"] / "memory.limit_in_bytes", memory)
            _write_if_there(
                group.v1["memory"] / "memory.memsw.limit_in_bytes", memory
            )  # no swapping past it
        if "pids" in group.v1:
            _write(group.v1["pids"] / "pids.max", str(limits.pids_max))
        if "cpu" in group.v1:  # v1 shares: 1024 is the default as 100 is v2's
            _write(group.v1["cpu"] / "cpu.shares", str(max(2, limits.cpu_weight * 1024 // 100)))
        if "devices" in group.v1:
            for major, minor in deny_devices:
                _write(group.v1["devices"] / "devices.deny", f"c {major}:{minor} rwm")

    def leftovers(self, keep: set[str], prefix: str = "") -> list[JobCgroup]:
        """Groups of this node named `prefix...` not in `keep`: left by an earlier agent."""
        names: set[str] = set()
        for base in self._bases():
            if base.is_dir():
                names |= {
                    child.name
                    for child in base.iterdir()
                    if child.is_dir() and child.name.startswith(prefix)
                }
        return [self.group(name) for name in sorted(names - keep)]

    def remove_bases(self) -> int:
        """When the agent exits (or its reaper, after it): remove the node's own groups
        (`gpuplatform/<node>` in each hierarchy) where no job group is left in them; the number
        removed. The next job makes them again (`_bases_again`). Without this every node name an
        agent ever ran as (an autoscaled node's, a test's) left an empty group behind."""
        removed = 0
        for base in self._bases():
            try:
                base.rmdir()
                removed += 1
            except FileNotFoundError:
                pass
            except OSError as error:
                if error.errno not in (errno.EBUSY, errno.ENOTEMPTY):
                    raise
        return removed

    def group(self, name: str) -> JobCgroup:
        return JobCgroup(
            v2=self.v2_base / name if self.v2_base else None,
            v1={controller: base / name for controller, base in self.v1_bases.items()},
        )


def remove_node_groups(cgroups: Cgroups | None) -> None:
    """`Cgroups.remove_bases` as an exiting agent (or its reaper) calls it: a failure is logged."""
    if cgroups is None:
        return
    try:
        cgroups.remove_bases()
    except OSError as error:
        log.warning("could not remove the node's cgroups: %s", error)


def _write_if_there(path: pathlib.Path, value: str) -> None:
    if path.exists():
        _write(path, value)


def wait_empty(path: pathlib.Path, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while _pids_in(path) and time.monotonic() < deadline:
        time.sleep(0.02)


def _own_cgroups() -> dict[str, str]:
    """Controller (or "" for the v2 hierarchy) -> this process's group path."""
    own = {}
    for line in pathlib.Path("/proc/self/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        for controller in controllers.split(",") if controllers else [""]:
            own[controller] = path
    return own


def _mounts() -> tuple[pathlib.Path | None, dict[str, tuple[pathlib.Path, str]]]:
    """The cgroup2 mount and the v1 mount of each controller (with its mount's root)."""
    v2: pathlib.Path | None = None
    v1: dict[str, tuple[pathlib.Path, str]] = {}
    for line in pathlib.Path("/proc/self/mountinfo").read_text().splitlines():
        left, _, right = line.partition(" - ")
        fields, tail = left.split(), right.split()
        if len(tail) < 3:
            continue
        if tail[0] == "cgroup2":
            v2 = pathlib.Path(fields[4])
        elif tail[0] == "cgroup":
            for option in tail[2].split(","):
                if option in V1_CONTROLLERS:
                    v1[option] = (pathlib.Path(fields[4]), fields[3])
    return v2, {name: (mount, root) for name, (mount, root) in v1.items()}


def _under(mount: pathlib.Path, mount_root: str, own: str) -> pathlib.Path:
    relative = own[len(mount_root) :] if own.startswith(mount_root) and mount_root != "/" else own
    return mount / relative.lstrip("/")


def _node_dir(node: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]", "_", node)


def find_cgroups(node: str) -> Cgroups | None:
    """The node's job group bases, created; None where the kernel refuses us."""
    v2_mount, v1_mounts = _mounts()
    own = _own_cgroups()
    if v2_mount is None:
        return None
    pure_v2 = not v1_mounts and v2_mount == CGROUP_ROOT
    v2_own = _under(v2_mount, "/", own.get("", "/"))
    v2_controllers = V2_LIMIT_CONTROLLERS
    try:
        v1_bases: dict[str, pathlib.Path] = {}
        if pure_v2:
            v2_base, v2_controllers = _delegate_v2(v2_own, node)
        else:
            v2_base = _mkdirs(v2_own, node)
            for controller, (mount, root) in v1_mounts.items():
                v1_bases[controller] = _mkdirs(_under(mount, root, own.get(controller, "/")), node)
            if "memory" not in v1_bases or "pids" not in v1_bases:
                log.warning("no v1 memory or pids controller: jobs would run without limits")
                return None
    except OSError as error:
        log.warning("cannot make job cgroups: %s", error)
        return None
    if not (v2_base / "cgroup.kill").exists() and "freezer" not in v1_bases:
        log.warning(
            "neither cgroup.kill nor a freezer: a job's processes could not be killed as a whole"
        )
        return None
    return Cgroups(
        v2_base=v2_base, v1_bases=v1_bases, pure_v2=pure_v2, v2_controllers=v2_controllers
    )


def _mkdirs(own: pathlib.Path, node: str) -> pathlib.Path:
    base = own / "gpuplatform" / _node_dir(node)
    base.mkdir(parents=True, exist_ok=True)
    return base


def _delegate_v2(own: pathlib.Path, node: str) -> tuple[pathlib.Path, tuple[str, ...]]:
    """Pure v2: controllers reach a child only through subtree_control, and a group with
    processes may not hand them on ("no internal processes"), so the agent first moves itself
    into a leaf of its own group (what systemd's Delegate=yes expects). Only the controllers
    the kernel offers here are asked for (asking for one it lacks is refused, ENOENT): a kernel
    without one still fences jobs, without that limit, and the agent's log names it. The base
    of the node's groups, and the controllers handed down to them."""
    offered = set((own / "cgroup.controllers").read_text().split())
    enabled = tuple(name for name in V2_LIMIT_CONTROLLERS if name in offered)
    missing = [name for name in V2_LIMIT_CONTROLLERS if name not in offered]
    if missing:
        log.warning("this kernel's cgroup v2 offers no %s controller here: jobs on this node run without "
                    "their %s limit", "/".join(missing), "/".join(V2_LIMIT_FILES[name] for name in missing))  # fmt: skip
    if not enabled:
        return _mkdirs(own, node), enabled  # nothing to hand on: membership and cgroup.kill only
    wanted = " ".join(f"+{name}" for name in enabled)
    try:
        _write(own / "cgroup.subtree_control", wanted)
    except OSError as error:
        if error.errno != errno.EBUSY:
            raise
        leaf = own / "agent"
        leaf.mkdir(exist_ok=True)
        for pid in _pids_in(own):
            try:
                _write(leaf / "cgroup.procs", str(pid))
            except OSError:
                pass  # a kernel thread or a process gone meanwhile
        _write(own / "cgroup.subtree_control", wanted)
    top = own / "gpuplatform"
    top.mkdir(exist_ok=True)
    _write(top / "cgroup.subtree_control", wanted)
    base = top / _node_dir(node)
    base.mkdir(exist_ok=True)
    _write(base / "cgroup.subtree_control", wanted)
    return base, enabled


# --- the uid pool -------------------------------------------------------------------------------


class UidPool:
    """One uid per attempt member, leased host-wide (several agents may share a host) by an
    O_EXCL file per uid; its gid is the same number, so no two live jobs share either."""

    def __init__(self, *, base: int, count: int, lease_dir: pathlib.Path):
        self.base, self.count, self.lease_dir = base, count, lease_dir
        lease_dir.mkdir(parents=True, exist_ok=True)
        lease_dir.chmod(0o700)
        # Round robin from the uid after the last one leased: from the base every lease tried
        # each uid the host's running and emptying jobs hold first (a failed open each).
        self._next = 0

    def lease(self, *, node: str, member: str) -> int:
        for step in range(self.count):
            uid = self.base + (self._next + step) % self.count
            try:
                fd = os.open(self.lease_dir / str(uid), os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            except FileExistsError:
                continue
            try:
                os.write(fd, f"{node} {member}\n".encode())
            finally:
                os.close(fd)
            self._next = (uid - self.base + 1) % self.count
            return uid
        raise RuntimeError(f"every job uid of {self.base}..{self.base + self.count - 1} is in use")

    def release(self, uid: int) -> None:
        (self.lease_dir / str(uid)).unlink(missing_ok=True)

    def release_node(self, node: str, keep: set[int]) -> int:
        """Leases an earlier agent of this node left (its jobs' cgroups are killed first)."""
        released = 0
        for path in self.lease_dir.iterdir():
            try:
                holder = path.read_text().split()[0]
            except (OSError, IndexError):
                continue
            if holder == node and path.name.isdigit() and int(path.name) not in keep:
                path.unlink(missing_ok=True)
                released += 1
        return released


# --- GPU device files ---------------------------------------------------------------------------


def make_fake_devices(dev_dir: pathlib.Path, count: int) -> None:
    """`--fake` GPUs get device files too, so the fence around them can be proved: char devices
    on NVIDIA's major (nothing answers them without the driver), plain files where mknod is
    refused."""
    dev_dir.mkdir(parents=True, exist_ok=True)
    for index in range(count):
        path = dev_dir / f"nvidia{index}"
        if path.exists():
            continue
        try:
            os.mknod(path, stat.S_IFCHR | 0o666, os.makedev(NVIDIA_MAJOR, index))
        except OSError:
            path.write_bytes(b"")
            path.chmod(0o666)


def gpu_device_files(dev_dir: pathlib.Path) -> dict[int, pathlib.Path]:
    """GPU index -> its device file (nvidiaN; nvidiactl and friends are not GPUs)."""
    found = {}
    if dev_dir.is_dir():
        for path in dev_dir.iterdir():
            match = re.fullmatch(r"nvidia(\d+)", path.name)
            if match:
                found[int(match.group(1))] = path
    return found


def char_device(path: pathlib.Path) -> tuple[int, int] | None:
    try:
        info = path.stat()
    except OSError:
        return None
    return (os.major(info.st_rdev), os.minor(info.st_rdev)) if stat.S_ISCHR(info.st_mode) else None


# --- detection ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Isolation:
    name: str  # the node's `isolation` word
    reason: str = ""  # why it is "none"
    cgroups: Cgroups | None = None
    uids: UidPool | None = None
    settings: Settings = field(default_factory=Settings.from_env)

    @property
    def jailed(self) -> bool:
        return self.name != NONE

    @property
    def layout(self) -> str:
        return self.cgroups.layout if self.cgroups else NONE


def unfenced(reason: str, settings: Settings | None = None) -> Isolation:
    return Isolation(name=NONE, reason=reason, settings=settings or Settings.from_env())


class FenceRefused(RuntimeError):
    """GPUPLATFORM_ISOLATION=strict, and this agent cannot fence jobs with every limit."""


def detect(node: str = "agent") -> Isolation:
    """Fence jobs if this agent can: root, a mount namespace, cgroups we may create. Under
    GPUPLATFORM_ISOLATION=strict, raises FenceRefused unless jobs are fenced with every limit."""
    isolation = _detect(node)
    if isolation.settings.mode == STRICT:
        missing = missing_limits(isolation)
        if missing:
            raise FenceRefused(
                f"GPUPLATFORM_ISOLATION=strict: this agent cannot fence jobs with every limit: {missing}"
            )
    return isolation


def missing_limits(isolation: Isolation) -> str:
    """What a fenced job here would lack ("" if nothing): the fence itself, or a limit's controller."""
    if not isolation.jailed or isolation.cgroups is None:
        return f"jobs would run unfenced ({isolation.reason})"
    cgroups = isolation.cgroups
    have = set(cgroups.v2_controllers) if cgroups.pure_v2 else set(cgroups.v1_bases)
    lacking = [name for name in V2_LIMIT_CONTROLLERS if name not in have]
    if lacking:
        return "no {} controller for jobs' cgroups: no {} limit".format(
            "/".join(lacking), "/".join(V2_LIMIT_FILES[name] for name in lacking)
        )
    return ""


def _detect(node: str) -> Isolation:
    settings = Settings.from_env()
    if settings.mode == NONE:
        return unfenced("turned off by GPUPLATFORM_ISOLATION=none", settings)
    if os.geteuid() != 0:
        return unfenced("the agent is not root", settings)
    if not hasattr(os, "setgroups") or not pathlib.Path("/proc/self/ns/mnt").exists():
        return unfenced("no mount namespaces", settings)
    cgroups = find_cgroups(node)
    if cgroups is None:
        return unfenced("no cgroups the agent may create", settings)
    try:
        uids = UidPool(
            base=settings.uid_base, count=settings.uid_count, lease_dir=settings.lease_dir
        )
    except OSError as error:
        return unfenced(f"cannot keep uid leases in {settings.lease_dir}: {error}", settings)
    return Isolation(name=JAILED, cgroups=cgroups, uids=uids, settings=settings)


def favors_dynmods(mounts: str | None = None) -> bool | None:
    """Whether the cgroup2 mount has `favordynmods` (None: no cgroup2 mount). Without it, moving
    a process into a cgroup (each fenced job's first step, workers/jail.py) waits for an RCU
    grace period once the cgroups have been still for a moment: 7-23 ms a start measured here
    (docs/operations.md, "Fenced job starts")."""
    text = mounts if mounts is not None else pathlib.Path("/proc/self/mounts").read_text()
    for line in text.splitlines():
        fields = line.split()
        if len(fields) >= 4 and fields[2] == "cgroup2":
            return "favordynmods" in fields[3].split(",")
    return None


def warn_if_unfenced(isolation: Isolation, node: str) -> None:
    if isolation.jailed:
        log.info("node %s fences its jobs: %s, %s", node, isolation.name, isolation.layout)
        if favors_dynmods() is False:
            log.info("cgroup2 is mounted without favordynmods: each job's start waits a kernel RCU grace "
                     "period (~10-20 ms) to join its cgroup; docs/operations.md, 'Fenced job starts'")  # fmt: skip
        return
    banner = "!" * 78
    log.warning(
        "\n%s\nNODE %s RUNS JOBS UNFENCED (isolation: none): %s.\nEvery job runs as the agent's own "
        "user and can read the agent's files and signal its processes.\nRun the agent as root with "
        "cgroups to fence jobs; strangers' commands are not placed here unless the operator opts in.\n%s",
        banner, node, isolation.reason, banner,
    )  # fmt: skip
