"""What a member starts with: its argv's `{python}`, its environment (the contract's names,
../shared/API.md) and its PATH, where `python` is always a Python 3.

Every member is one process the platform starts, so in a launcher's words each member is a
node of its own: `NODE_RANK` is its rank, `NNODES` the gang's size, `LOCAL_RANK` 0 and
`LOCAL_WORLD_SIZE` 1. `torchrun --nnodes=$NNODES --node_rank=$NODE_RANK --nproc_per_node=G`
inside a member starts its G processes and sets their own RANK, LOCAL_RANK and WORLD_SIZE.
"""

from __future__ import annotations

import json
import os
import pathlib
import shutil
import sys

from workers.run import Run

SDK_DIR = pathlib.Path(__file__).resolve().parent / "sdk"
ENV_PASSTHROUGH = ("LD_LIBRARY_PATH", "CUDA_HOME", "NVIDIA_DRIVER_CAPABILITIES", "TZ")
SYSTEM_PATH = "/usr/local/bin:/usr/bin:/bin"
# The interpreter `{python}` stands for, resolved once (not per job: a stat per path component).
INTERPRETER_DIRS = {
    pathlib.Path(p).resolve() for p in (sys.prefix, sys.base_prefix, sys.exec_prefix)
}


def python3() -> pathlib.Path:
    """The Python 3 a job's `python` runs where its environment has none: the `python3` of the
    job's PATH (the one the job would find itself), else the agent's own interpreter."""
    found = shutil.which("python3", path=SYSTEM_PATH)
    return pathlib.Path(found) if found else pathlib.Path(sys.executable)


def make_python_dir(data_dir: pathlib.Path) -> pathlib.Path:
    """`<data dir>/bin` holding `python` (a link to `python3()`), on every job's PATH after its
    environment's own bin: a distribution with no `python` (Debian, Ubuntu) or a Python 2 one
    still gives the job a Python 3 under that name. Made anew at each agent start (the host's
    Python may have moved); read-only to jobs (root's, 0755), reached through the fence as the
    job's other dirs are."""
    bin_dir = data_dir / "bin"
    bin_dir.mkdir(mode=0o755, exist_ok=True)
    bin_dir.chmod(0o755)
    link = bin_dir / "python"
    tmp = bin_dir / ".python.tmp"
    tmp.unlink(missing_ok=True)
    tmp.symlink_to(python3())
    os.replace(tmp, link)
    return bin_dir


def argv(run: Run) -> list[str]:
    """The member's argv, `{python}` its environment's interpreter, else the agent's."""
    python = str(run.env_dir / "bin" / "python") if run.env_dir else sys.executable
    return [python if part == "{python}" else part for part in run.assignment.argv]


def environment(run: Run, *, node: str, python_dir: pathlib.Path, output: pathlib.Path,
                control: pathlib.Path, resume: str, visible_devices: str,
                device_dir: pathlib.Path | None) -> dict[str, str]:  # fmt: skip
    """The member's whole environment: nothing of the agent's but ENV_PASSTHROUGH."""
    a = run.assignment
    env = {k: os.environ[k] for k in ENV_PASSTHROUGH if k in os.environ}
    # The job's own variables, then its secrets, then the platform's: a name the platform
    # sets always wins (the platform refuses them at submit anyway).
    env.update({str(k): str(v) for k, v in (getattr(a, "env", None) or {}).items()})
    env.update(run.secret_values)
    path = f"{python_dir}:{SYSTEM_PATH}"
    if run.env_dir is not None:
        path = f"{run.env_dir / 'bin'}:{path}"
        env["VIRTUAL_ENV"] = str(run.env_dir)
    env.update(
        PATH=path, HOME=str(run.workdir), TMPDIR=str(run.workdir / "tmp"),
        LANG="C.UTF-8", PYTHONUNBUFFERED="1", PYTHONPATH=str(SDK_DIR),
        CUDA_VISIBLE_DEVICES=visible_devices,
        RANK=str(a.rank), LOCAL_RANK="0", WORLD_SIZE=str(a.world_size),
        NODE_RANK=str(a.rank), NNODES=str(a.world_size), LOCAL_WORLD_SIZE="1",
        MASTER_ADDR=a.master_addr, MASTER_PORT=str(run.master_port or a.master_port),
        GPUPLATFORM_NODE=node, GPUPLATFORM_JOB_ID=a.job_id,
        GPUPLATFORM_ATTEMPT_ID=str(a.attempt_id), GPUPLATFORM_ATTEMPT=str(a.attempt_number),
        GPUPLATFORM_PARAMS=json.dumps(a.params), GPUPLATFORM_OUTPUT_DIR=str(output),
        GPUPLATFORM_CHECKPOINT_DIR=str(run.checkpoint_dir), GPUPLATFORM_RESUME_FROM=resume,
        GPUPLATFORM_PROGRESS_FILE=str(control / "progress.json"),
        GPUPLATFORM_CHECKPOINT_FILE=str(control / "checkpoint.json"),
        GPUPLATFORM_GPU_INDICES=",".join(str(i) for i in a.gpu_indices),
    )  # fmt: skip
    if device_dir is not None and device_dir.is_dir():
        env["GPUPLATFORM_DEVICE_DIR"] = str(device_dir)
    index = getattr(a, "array_index", None)  # a task of a job array (docs/arrays.md)
    if index is not None:
        env["GPUPLATFORM_ARRAY_INDEX"] = env["SLURM_ARRAY_TASK_ID"] = str(index)
    return env
