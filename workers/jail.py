"""What a fenced job's process does between fork and exec, as root: `enter(spec, status_fd)`,
run in the child the fork server forks for each job (workers/forkserver.py). It joins the
member's cgroups, enters a mount namespace of its own (a fresh tmpfs on /tmp, /var/tmp and
/dev/shm; only the paths the job needs made reachable; other GPUs' device files covered), drops
to the job's uid and gid with no supplementary groups, asks to die with its parent (the fork
server, which dies with the agent), and changes to the job's work dir; the fork server's child
then execs the job (argv, its environment: never a shell). Any failure is written to
`status_fd` (a pipe only the fork server reads, and says to the agent) and raised, so the child
ends before any exec and the runner says why the job could not start.

No new interpreter per job: the child is a fork of the fork server, and this runs before
anything of the job's does. Between fork and exec the child holds a copy of the fork server's
memory (the job's request, its environment), but only as root until `become`, which first makes
it not dumpable (as the kernel does at a uid change), so no process of that uid can read it
before the exec replaces it. It uses only os calls and libc through ctypes, already loaded: no
import, no thread (a mount namespace of one's own needs a process of one thread).
"""

from __future__ import annotations

import ctypes
import importlib.util
import os

CLONE_NEWNS = 0x00020000
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_BIND, MS_REC, MS_PRIVATE = 1, 2, 4, 4096, 16384, 1 << 18
PR_SET_PDEATHSIG, PR_SET_DUMPABLE, PR_SET_NO_NEW_PRIVS = 1, 4, 38
SIGKILL = 9
libc = ctypes.CDLL(None, use_errno=True)


def _beside(name: str):
    """A module of this dir, loaded as this one is (the fork server runs with `-I`: no package)."""
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), f"{name}.py")
    spec = importlib.util.spec_from_file_location(f"gpuplatform_{name}", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


image_root = _beside("image_root")  # an OCI image's root as the job's / (docs/images.md)


def _check(result: int, what: str) -> None:
    if result != 0:
        error = ctypes.get_errno()
        raise OSError(error, f"{what}: {os.strerror(error)}")


def mount(
    source: str, target: str, fstype: str | None, flags: int, data: str | None = None
) -> None:
    _check(libc.mount(source.encode(), target.encode(), fstype.encode() if fstype else None, flags,
                      data.encode() if data else None), f"mount {target}")  # fmt: skip


def join_cgroups(procs_files: list[str]) -> None:
    for path in procs_files:
        fd = os.open(path, os.O_WRONLY | os.O_CLOEXEC)
        try:
            os.write(fd, str(os.getpid()).encode())
        finally:
            os.close(fd)


def _inside(path: str, top: str) -> bool:
    return path == top or path.startswith(top.rstrip("/") + "/")


def _hidden_top(path: str, private: list[str]) -> str | None:
    """The mount that will hide `path` from the job: a private dir it lies in, else its
    highest ancestor others may not traverse (an 0700 data dir, /root); None: reachable as is."""
    for top in private:
        if _inside(path, top):
            return top
    current = "/"
    for part in path.strip("/").split("/")[:-1]:
        current = os.path.join(current, part)
        if not os.stat(current).st_mode & 0o001:
            return current
    return None


def _mount_point(path: str, like_dir: bool) -> None:
    os.makedirs(os.path.dirname(path), mode=0o755, exist_ok=True)
    if like_dir:
        os.makedirs(path, mode=0o755, exist_ok=True)
    elif not os.path.exists(path):
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT, 0o444))


def enter_namespace(spec: dict) -> None:
    """A mount namespace where the job's own paths sit where the agent sees them (same
    names inside and out), on fresh tmpfs over everything that hid them, and nothing else."""
    private = spec["private"]
    exposed = [os.path.abspath(p) for p in spec["expose"] if os.path.exists(p)]
    covered = {path: _hidden_top(path, private) for path in exposed}  # decided while still visible
    tops = {top for top in covered.values() if top}
    tops |= {top for top in private if os.path.isdir(top)}
    _check(libc.unshare(CLONE_NEWNS), "unshare(CLONE_NEWNS)")
    mount("none", "/", None, MS_REC | MS_PRIVATE)  # nothing we mount reaches the host
    # Hold every exposed path open before covering its ancestor makes its name unreachable
    # (opened inside the new namespace: a bind's source must be one of its mounts).
    held = {path: os.open(path, os.O_PATH | os.O_CLOEXEC) for path in exposed}
    for top in sorted(tops, key=len):
        if any(other != top and _inside(top, other) for other in tops):
            continue  # already under a fresh tmpfs: made below
        mode = "1777" if top in private else "0755"
        mount("tmpfs", top, "tmpfs", MS_NOSUID | MS_NODEV, f"mode={mode},size={spec['tmp_size']}")
    for path in sorted(exposed, key=len):
        if covered[path] is None and not any(_inside(path, top) for top in tops):
            continue
        _mount_point(path, os.path.isdir(f"/proc/self/fd/{held[path]}"))
        mount(f"/proc/self/fd/{held[path]}", path, None, MS_BIND | MS_REC)
    for path in spec["hide"]:  # other GPUs' device files: a root-only empty file over each
        if os.path.lexists(path):  # (one under a fresh tmpfs is gone already)
            mount(_blank(), path, None, MS_BIND)
    for fd in held.values():
        os.close(fd)


def _blank() -> str:
    """An empty root-only file on the job's own /dev/shm (a tmpfs of this namespace by now)."""
    path = "/dev/shm/.gpuplatform-hidden"
    os.close(os.open(path, os.O_RDONLY | os.O_CREAT | os.O_CLOEXEC, 0o000))
    os.chmod(path, 0o000)
    return path


def become(uid: int, gid: int) -> None:
    # Not dumpable before the uid changes (the kernel does it too): until the exec, nothing
    # running as the job's uid may read this copy of the agent's memory.
    _check(libc.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0), "prctl(PR_SET_DUMPABLE)")
    os.setgroups([])
    os.setresgid(gid, gid, gid)
    os.setresuid(uid, uid, uid)
    # Changing uid cleared the parent-death signal: ask again, then check the agent is still
    # there (it may have died before we asked, and then no signal would ever come).
    _check(libc.prctl(PR_SET_PDEATHSIG, SIGKILL, 0, 0, 0), "prctl(PR_SET_PDEATHSIG)")
    _check(
        libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "prctl(PR_SET_NO_NEW_PRIVS)"
    )  # no setuid way back


def enter(spec: dict, status_fd: int, *, joined: bool = False) -> None:
    """The fence, in the forked child, before the job's exec: cgroups (unless `joined`: the
    fork server's spare is in them already), namespace, uid, the parent-still-there check
    (`agent_pid`: the fork server's pid), the work dir. A failure is written to `status_fd` and
    raised (the child then ends without exec)."""
    try:
        if not joined:
            join_cgroups(spec["cgroup_procs"])
        if spec.get("image"):  # an OCI image's root as its / (docs/images.md)
            image_root.enter_image(spec)
        else:
            enter_namespace(spec)
        become(spec["uid"], spec["gid"])
        if os.getppid() != spec["agent_pid"]:
            raise OSError("the agent is gone")
        os.chdir(spec["cwd"])
    except BaseException as error:
        os.write(status_fd, f"{error}"[:500].encode(errors="replace"))
        raise
