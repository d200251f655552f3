"""The job-side SDK: what a job process uses to talk to the platform. Standard library only
(no Django): the runner puts this directory on the job's PYTHONPATH.

    from gpuplatform_job import params, report_progress, save_checkpoint, resume_from, output_dir
    from gpuplatform_job import inputs, read_input  # a pipeline's step: its dependencies' artifacts

Checkpoints (docs/pytorch.md): each rank saves its own, one at a time, as JSON state
(`save_checkpoint`), any bytes (`checkpoint_file`: `torch.save(state, f)`) or a directory
(`checkpoint_directory`: a sharded or FSDP checkpoint); the platform stores the last one saved
and hands it back to the same rank of the job's next attempt, on whichever node it runs
(`resume_from`, `resume_path`, `resume_dir`).
"""

from __future__ import annotations

import contextlib
import json
import os
import pathlib
import shutil
import signal
import tarfile
import tempfile
import time
from collections.abc import Iterator
from typing import Any, BinaryIO

_stop_requested = False
DIR_SUFFIX = ".dir.tar"  # a checkpoint_directory() as the one file the platform stores


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
    """Save resumable state (JSON) atomically; the platform records it as the attempt's checkpoint."""
    path = checkpoint_dir() / _plain(name)
    _write_atomic(path, state)
    _mark(path, state)
    return path


@contextlib.contextmanager
def checkpoint_file(name: str = "checkpoint.pt") -> Iterator[BinaryIO]:
    """A file to write this rank's checkpoint into, any bytes:

        with checkpoint_file("model.pt") as f:
            torch.save({"model": model.state_dict(), "step": step}, f)

    It replaces the last checkpoint only when the block ends without an exception (written to a
    temporary file, flushed, then renamed): a job stopped half way leaves the last one whole."""
    path = checkpoint_dir() / _plain(name)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "wb") as handle:
            yield handle
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    _mark(path, None)


def save_checkpoint_bytes(data: bytes, name: str = "checkpoint.bin") -> pathlib.Path:
    """`checkpoint_file` for bytes already in memory."""
    with checkpoint_file(name) as handle:
        handle.write(data)
    return checkpoint_dir() / _plain(name)


@contextlib.contextmanager
def checkpoint_directory(name: str = "checkpoint") -> Iterator[pathlib.Path]:
    """An empty directory for this rank's checkpoint of many files (each rank its own: a sharded
    or FSDP checkpoint, `torch.distributed.checkpoint.save(state, checkpoint_id=path)`):

        with checkpoint_directory() as path:
            torch.save(shard, path / f"shard-{rank}.pt")

    When the block ends without an exception it is packed into one file (`<name>.dir.tar`, in
    the checkpoint dir) that replaces the last checkpoint; `resume_dir()` unpacks it again."""
    staging = pathlib.Path(tempfile.mkdtemp(dir=checkpoint_dir(), prefix=f".{_plain(name)}.new."))
    try:
        yield staging
        with checkpoint_file(_plain(name) + DIR_SUFFIX) as handle:
            with tarfile.open(fileobj=handle, mode="w") as tar:
                for path in sorted(staging.rglob("*")):
                    tar.add(path, arcname=path.relative_to(staging).as_posix(), recursive=False)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def _plain(name: str) -> str:
    if not name or "/" in name or name in (".", "..") or name.startswith("."):
        raise ValueError(f"a checkpoint's name is a plain file name, not {name!r}")
    return name


def _mark(path: pathlib.Path, state: dict[str, Any] | None) -> None:
    """Tell the runner which file holds this rank's checkpoint now (it uploads it from there)."""
    marker = os.environ.get("GPUPLATFORM_CHECKPOINT_FILE")
    if marker:
        _write_atomic(pathlib.Path(marker), {"path": str(path), "state": state, "at": time.time()})


def resume_path() -> pathlib.Path | None:
    """The file of this rank's checkpoint that the job's earlier attempt saved last (any kind),
    or None on a first start: `torch.load(resume_path())` for a `checkpoint_file`."""
    path = os.environ.get("GPUPLATFORM_RESUME_FROM")
    return pathlib.Path(path) if path and os.path.exists(path) else None


def resume_from() -> dict[str, Any] | None:
    """The state saved by an earlier attempt of this job (`save_checkpoint`), or None on a first
    start or when that attempt saved bytes or a directory instead (`resume_path`, `resume_dir`)."""
    path = resume_path()
    if path is None or path.name.endswith(DIR_SUFFIX):
        return None
    try:
        with open(path, encoding="utf-8") as handle:
            state = json.load(handle)
    except (ValueError, UnicodeDecodeError):
        return None
    return state if isinstance(state, dict) else None


def resume_dir() -> pathlib.Path | None:
    """The directory this rank saved with `checkpoint_directory` in an earlier attempt, unpacked
    anew (`<checkpoint dir>/<name>.resumed`), or None on a first start or when that attempt
    saved JSON or bytes instead."""
    path = resume_path()
    if path is None or not path.name.endswith(DIR_SUFFIX):
        return None
    target = path.with_name(path.name[: -len(DIR_SUFFIX)] + ".resumed")
    shutil.rmtree(target, ignore_errors=True)
    target.mkdir()
    with tarfile.open(path) as tar:
        if hasattr(tarfile, "data_filter"):  # nothing outside target, no devices, no odd modes
            tar.extractall(target, filter="data")
        else:  # pragma: no cover (Pythons before 3.11.4): members checked by hand
            for member in tar.getmembers():
                if not (member.isfile() or member.isdir()) or ".." in member.name.split("/"):
                    raise ValueError(f"unexpected entry in the checkpoint: {member.name!r}")
                if member.name.startswith("/"):
                    raise ValueError(f"unexpected entry in the checkpoint: {member.name!r}")
            tar.extractall(target)  # noqa: S202 (checked above)
    return target


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
