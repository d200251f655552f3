"""The job-side SDK: what a job process uses to talk to the platform. Standard library only
(no Django): the runner puts this directory on the job's PYTHONPATH.

    from gpuplatform_job import params, report_progress, save_checkpoint, resume_from, output_dir
    from gpuplatform_job import inputs, read_input  # a pipeline's step: its dependencies' artifacts
"""

from __future__ import annotations

import json
import os
import pathlib
import signal
import tempfile
import time
from typing import Any

_stop_requested = False


def params() -> dict[str, Any]:
    """The job's template parameters (already validated by the platform)."""
    return json.loads(os.environ.get("GPUPLATFORM_PARAMS") or "{}")


def output_dir() -> pathlib.Path:
    """Files written here become the job's artifacts when it ends."""
    path = pathlib.Path(os.environ.get("GPUPLATFORM_OUTPUT_DIR", "output"))
    path.mkdir(parents=True, exist_ok=True)
    return path


def input_dir() -> pathlib.Path | None:
    """Where the agent put the artifacts of this job's dependencies (docs/pipelines.md), or None
    for a job without dependencies."""
    path = os.environ.get("GPUPLATFORM_INPUT_DIR")
    return pathlib.Path(path) if path else None


def inputs() -> list[dict[str, Any]]:
    """The artifacts of this job's dependencies: one dict each, with `job` (the parent's id),
    `name`, `size`, `sha256` and `path` (the local file). Empty without dependencies."""
    root = input_dir()
    if root is None or not (root / "inputs.json").exists():
        return []
    entries = json.loads((root / "inputs.json").read_text())["inputs"]
    return [{**entry, "path": root / entry["path"]} for entry in entries]


def read_input(job_id: str, name: str) -> bytes:
    """The content of artifact `name` of the parent job `job_id` (KeyError if it has none)."""
    for entry in inputs():
        if entry["job"] == str(job_id) and entry["name"] == name:
            return pathlib.Path(entry["path"]).read_bytes()
    raise KeyError(f"no input {name!r} of job {job_id}")


def checkpoint_dir() -> pathlib.Path:
    """Survives attempts: the next attempt of this job sees what was saved here."""
    path = pathlib.Path(os.environ.get("GPUPLATFORM_CHECKPOINT_DIR", "checkpoints"))
    path.mkdir(parents=True, exist_ok=True)
    return path


def _write_atomic(path: pathlib.Path, data: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    with os.fdopen(fd, "w") as handle:
        json.dump(data, handle)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(tmp, path)


def report_progress(fraction: float, *, step: int | None = None, message: str = "") -> None:
    """Tell the platform how far along the job is (0..1). Cheap: a small file the runner reads."""
    target = os.environ.get("GPUPLATFORM_PROGRESS_FILE")
    if not target:
        return
    _write_atomic(
        pathlib.Path(target),
        {
            "progress": max(0.0, min(1.0, float(fraction))),
            "step": step,
            "message": message,
            "at": time.time(),
        },
    )


def save_checkpoint(state: dict[str, Any], name: str = "checkpoint.json") -> pathlib.Path:
    """Save resumable state atomically; the platform records it as the attempt's checkpoint."""
    path = checkpoint_dir() / name
    _write_atomic(path, state)
    marker = os.environ.get("GPUPLATFORM_CHECKPOINT_FILE")
    if marker:
        _write_atomic(pathlib.Path(marker), {"path": str(path), "state": state, "at": time.time()})
    return path


def resume_from() -> dict[str, Any] | None:
    """The state saved by an earlier attempt of this job, or None on a first start."""
    path = os.environ.get("GPUPLATFORM_RESUME_FROM")
    if not path or not os.path.exists(path):
        return None
    with open(path) as handle:
        return json.load(handle)


def stop_requested() -> bool:
    """True once the platform asked this job to checkpoint and exit (preemption)."""
    return _stop_requested


def _on_checkpoint_signal(signum, frame) -> None:
    global _stop_requested
    _stop_requested = True


def install_checkpoint_handler() -> None:
    """Turn the platform's checkpoint signal (SIGUSR1 by default) into `stop_requested()`."""
    signum = int(os.environ.get("GPUPLATFORM_CHECKPOINT_SIGNAL", signal.SIGUSR1))
    signal.signal(signum, _on_checkpoint_signal)
