"""An image's root as a fenced job's `/` (docs/images.md): what workers/jail.py runs, in the
child between fork and exec, as root, instead of its host-path namespace when the job has an
image (`spec["image"]`, made by workers/images.py `fence_spec`).

In a mount namespace of the job's own (nothing mounted here reaches the host):
- `<scratch>/root`: an overlay of the image's shared read-only root (lower) and the member's own
  upper dir, mounted nosuid,nodev: the job's writes land in its own layer, never the cache's.
  Where the kernel refuses an overlay, the agent made a private copy of the root for the member
  (`spec["image"]["copy"]`) and it is bind-mounted there instead, nosuid,nodev as well;
- a fresh /proc (hidepid=2: only the job's own uid's processes show), a /dev (tmpfs) with only
  null, zero, full, random, urandom and tty and the member's own GPUs' device files, a private
  /tmp and /dev/shm (tmpfs);
- the member's work and checkpoint dirs bound at the paths they have on the host (the job's
  environment names them), and, for a job with GPUs on a host with a driver, the driver's
  libraries and tools (`spec["image"]["driver"]`, workers/image_driver.py) bound read-only,
  nosuid and nodev; nothing else of the host;
- then pivot_root into it and the old root detached: no host path is left to reach.
As jail.py: only os calls and libc through ctypes, no import after the fork, no thread.
"""

from __future__ import annotations

import ctypes
import os
import platform

CLONE_NEWNS, MNT_DETACH = 0x00020000, 2
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_REMOUNT = 1, 2, 4, 8, 32
MS_BIND, MS_REC, MS_PRIVATE = 4096, 16384, 1 << 18
PIVOT_ROOT = {"x86_64": 155, "aarch64": 41}.get(platform.machine(), 155)  # syscall numbers
DEVICES = ("null", "zero", "full", "random", "urandom", "tty")
NOSUID_NODEV = MS_NOSUID | MS_NODEV
libc = ctypes.CDLL(None, use_errno=True)


def _check(result: int, what: str) -> None:
    if result != 0:
        error = ctypes.get_errno()
        raise OSError(error, f"{what}: {os.strerror(error)}")


def mount(
    source: str, target: str, fstype: str | None, flags: int, data: str | None = None
) -> None:
    _check(libc.mount(source.encode(), target.encode(), fstype.encode() if fstype else None, flags,
                      data.encode() if data else None), f"mount {target}")  # fmt: skip


def _inside(root: str, path: str) -> str:
    return os.path.join(root, path.lstrip("/"))


def _point(path: str, like_dir: bool) -> None:
    os.makedirs(os.path.dirname(path), mode=0o755, exist_ok=True)
    if like_dir:
        os.makedirs(path, mode=0o755, exist_ok=True)
    elif not os.path.exists(path):
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, 0o644))


def _root(image: dict) -> str:
    root = image["mount"]
    if image.get("copy"):
        mount(image["copy"], root, None, MS_BIND | MS_REC)
        mount("none", root, None, MS_REMOUNT | MS_BIND | NOSUID_NODEV)
    else:
        options = f"lowerdir={image['rootfs']},upperdir={image['upper']},workdir={image['work']}"
        mount("overlay", root, "overlay", NOSUID_NODEV, options)
    return root


def enter_image(spec: dict) -> None:
    image = spec["image"]
    _check(libc.unshare(CLONE_NEWNS), "unshare(CLONE_NEWNS)")
    mount("none", "/", None, MS_REC | MS_PRIVATE)
    root = _root(image)
    _point(_inside(root, "/proc"), True)
    mount("proc", _inside(root, "/proc"), "proc", NOSUID_NODEV | MS_NOEXEC, "hidepid=2")
    dev = _inside(root, "/dev")
    _point(dev, True)
    mount("tmpfs", dev, "tmpfs", MS_NOSUID | MS_NOEXEC, "mode=0755,size=1m")
    for name in DEVICES:
        if os.path.exists(f"/dev/{name}"):
            _point(f"{dev}/{name}", False)
            mount(f"/dev/{name}", f"{dev}/{name}", None, MS_BIND)
    for path in image["devices"]:  # its own GPUs only, by their names
        target = f"{dev}/{os.path.basename(path)}"
        _point(target, False)
        mount(path, target, None, MS_BIND)
    for private in ("/tmp", "/dev/shm"):
        _point(_inside(root, private), True)
        mount("tmpfs", _inside(root, private), "tmpfs", NOSUID_NODEV,
                   f"mode=1777,size={spec['tmp_size']}")  # fmt: skip
    for path in image["binds"]:  # work and checkpoint dirs, at their host paths
        target = _inside(root, path)
        _point(target, True)
        mount(path, target, None, MS_BIND | MS_REC)
    for source, path in image.get("driver") or []:  # the host's NVIDIA driver, read-only
        target = _inside(root, path)
        _point(target, False)
        mount(source, target, None, MS_BIND)
        mount("none", target, None, MS_REMOUNT | MS_BIND | MS_RDONLY | NOSUID_NODEV)
    if image.get("working_dir"):
        _point(_inside(root, image["working_dir"]), True)
    os.chdir(root)
    _check(libc.syscall(PIVOT_ROOT, ctypes.c_char_p(b"."), ctypes.c_char_p(b".")), "pivot_root")
    _check(libc.umount2(b".", MNT_DETACH), "umount old root")
    os.chdir("/")
