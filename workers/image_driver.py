"""The host's NVIDIA driver in a job's image root (docs/images.md, "Real GPUs"), as enroot's hooks
and libnvidia-container bring it: a CUDA image carries the toolkit, never the driver, whose
user-space half must match the node's kernel module. Pure Python, no Django: the agent decides
what to bind (`mounts`), workers/image_root.py binds it read-only in the job's namespace.

- Only where the job has GPUs and the host has a driver (`/proc/driver/nvidia/version`).
- The libraries: what `ldconfig -p` lists for this machine's ABI named as LIBRARIES says
  (`libnvidia-*`, among them NVML's `libnvidia-ml`; `libcuda.so*`; `libnvcuvid.so*`; never
  the toolkit's `libcudart` or `libcublas`, which are the image's), each bound by its name (the
  host's symlink resolved) into LIB_DIR.
- The tools: BINARIES found on the host's PATH (nvidia-smi first), bound into BIN_DIR.
- LIB_DIR and BIN_DIR are the directories NVIDIA's own CUDA images (NGC's) put on their
  LD_LIBRARY_PATH and PATH (nvidia-docker's `/usr/local/nvidia`); the job's environment gets
  both appended where the image does not name them already (`environment`), so the loader finds
  the driver without running ldconfig in the image.
- The control devices (nvidiactl, nvidia-uvm, nvidia-uvm-tools, nvidia-modeset) beside the
  job's own GPUs' device files: CUDA opens them as well as its GPUs'.

The discovery runs `ldconfig -p` once per DISCOVERY_TTL seconds per agent, not per job.
"""

from __future__ import annotations

import os
import pathlib
import re
import shutil
import subprocess
import time

PROC_VERSION = pathlib.Path("/proc/driver/nvidia/version")
# The driver's libraries by name: libnvidia-* (NVML's libnvidia-ml among them), libcuda and
# libcudadebugger, libnvcuvid; not the toolkit's (libcudart, libcublas...: the image's own).
LIBRARIES = re.compile(r"libnvidia-[\w.+-]+|(?:libcuda|libcudadebugger|libnvcuvid)\.so[.0-9]*")
BINARIES = ("nvidia-smi", "nvidia-debugdump", "nvidia-cuda-mps-control", "nvidia-cuda-mps-server")
CONTROL_DEVICES = ("nvidiactl", "nvidia-uvm", "nvidia-uvm-tools", "nvidia-modeset")
LIB_DIR, BIN_DIR = "/usr/local/nvidia/lib64", "/usr/local/nvidia/bin"
# ldconfig's ABI words for this machine's own libraries (its 32-bit ones are left out).
ABI = {"x86_64": "x86-64", "aarch64": "AArch64"}.get(os.uname().machine, os.uname().machine)
DISCOVERY_TTL = 300.0
LINE = re.compile(r"^\s*(?P<name>\S+)\s+\((?P<abi>[^)]*)\)\s+=>\s+(?P<path>/\S+)\s*$")

_found: tuple[float, list[tuple[str, str]]] | None = None


def libraries(ldconfig_output: str, abi: str | None = None) -> list[tuple[str, str]]:
    """(host path, path in the image) of each driver library `ldconfig -p` names for `abi`,
    once per name (ldconfig lists the first it would load first)."""
    found: dict[str, str] = {}
    for line in ldconfig_output.splitlines():
        match = LINE.match(line)
        if match is None:
            continue
        name, flags, path = match.group("name"), match.group("abi"), match.group("path")
        if not LIBRARIES.fullmatch(name) or (abi or ABI) not in flags.split(","):
            continue
        found.setdefault(name, path)
    return [(path, f"{LIB_DIR}/{name}") for name, path in sorted(found.items())]


def binaries(which=shutil.which) -> list[tuple[str, str]]:
    """(host path, path in the image) of the driver's tools found on the host."""
    found = [(which(name), name) for name in BINARIES]
    return [(path, f"{BIN_DIR}/{name}") for path, name in found if path]


def host_has_driver() -> bool:
    return PROC_VERSION.exists()


def _ldconfig() -> str:
    program = shutil.which("ldconfig") or "/sbin/ldconfig"
    try:
        result = subprocess.run(  # noqa: S603 (a fixed argv)
            [program, "-p"], capture_output=True, text=True, timeout=30, check=False
        )
    except (OSError, subprocess.TimeoutExpired):
        return ""
    return result.stdout if result.returncode == 0 else ""


def discover() -> list[tuple[str, str]]:
    """The host's driver files to bind into an image ([] without a driver), cached a while."""
    global _found
    now = time.monotonic()
    if _found is None or now - _found[0] > DISCOVERY_TTL:
        files = libraries(_ldconfig()) + binaries() if host_has_driver() else []
        _found = (now, files)
    return list(_found[1])


def mounts(gpus: bool) -> list[tuple[str, str]]:
    """What a member's image root gets of the driver: nothing without GPUs or a driver."""
    return discover() if gpus else []


def control_devices(own_gpus: list[pathlib.Path]) -> list[str]:
    """The driver's control device files beside the job's own GPUs' (where they exist)."""
    if not own_gpus:
        return []
    where = own_gpus[0].parent
    return [str(where / name) for name in CONTROL_DEVICES if (where / name).exists()]


def environment(env: dict[str, str]) -> dict[str, str]:
    """PATH and LD_LIBRARY_PATH with the driver's dirs appended, unless already named."""
    out = dict(env)
    for name, extra in (("PATH", BIN_DIR), ("LD_LIBRARY_PATH", LIB_DIR)):
        parts = [part for part in out.get(name, "").split(":") if part]
        if extra not in parts:
            out[name] = ":".join([*parts, extra])
    return out
