"""What a member starts with: its argv's `{python}` and its environment (the contract's names,
../shared/API.md)."""

from __future__ import annotations

import json
import os
import pathlib
import sys

from workers.run import Run

SDK_DIR = pathlib.Path(__file__).resolve().parent / "sdk"
ENV_PASSTHROUGH = ("LD_LIBRARY_PATH", "CUDA_HOME", "NVIDIA_DRIVER_CAPABILITIES", "TZ")
SYSTEM_PATH = "/usr/local/bin:/usr/bin:/bin"
# The interpreter `{python}` stands for, resolved once (not per job: a stat per path component).
INTERPRETER_DIRS = {
    pathlib.Path(p).resolve() for p in (sys.prefix, sys.base_prefix, sys.exec_prefix)
}


def argv(run: Run) -> list[str]:
    """The member's argv, `{python}` its environment's interpreter, else the agent's."""
    python = str(run.env_dir / "bin" / "python") if run.env_dir else sys.executable
    return [python if part == "{python}" else part for part in run.assignment.argv]


def environment(run: Run, *, node: str, output: pathlib.Path, control: pathlib.Path, resume: str,
                visible_devices: str, device_dir: pathlib.Path | None) -> dict[str, str]:  # fmt: skip
    """The member's whole environment: nothing of the agent's but ENV_PASSTHROUGH."""
    a = run.assignment
    env = {k: os.environ[k] for k in ENV_PASSTHROUGH if k in os.environ}
    # The job's own variables, then its secrets, then the platform's: a name the platform
    # sets always wins (the platform refuses them at submit anyway).
    env.update({str(k): str(v) for k, v in (getattr(a, "env", None) or {}).items()})
    env.update(run.secret_values)
    path = SYSTEM_PATH
    if run.env_dir is not None:
        path = f"{run.env_dir / 'bin'}:{path}"
        env["VIRTUAL_ENV"] = str(run.env_dir)
    env.update(
        PATH=path, HOME=str(run.workdir), TMPDIR=str(run.workdir / "tmp"),
        LANG="C.UTF-8", PYTHONUNBUFFERED="1", PYTHONPATH=str(SDK_DIR),
        CUDA_VISIBLE_DEVICES=visible_devices,
        RANK=str(a.rank), LOCAL_RANK="0", WORLD_SIZE=str(a.world_size),
        MASTER_ADDR=a.master_addr, MASTER_PORT=str(a.master_port),
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
