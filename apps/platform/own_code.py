"""The own-code fields' rules (docs/own-code.md), pure Python: the submit's validation
(apps/jobs/own_code.py) applies them, and the node agent may read the same names.

Environment variable and secret names are `[A-Z_][A-Z0-9_]*`. Names the platform sets in a
job's environment (workers/runner.py `_environment` and `ENV_PASSTHROUGH`, the GPU and rank
variables, an array task's index) or that change how every program loads are reserved: a job
cannot set them, neither as `env` nor as a secret's name.
"""

from __future__ import annotations

import re

NAME = re.compile(r"^[A-Z_][A-Z0-9_]*$")
SHA256 = re.compile(r"^[0-9a-f]{64}$")
MAX_NAME = 128
MAX_ENV = 64  # entries of `env`
MAX_ENV_VALUE = 4096  # characters of one value
MAX_SECRETS = 64
MAX_REQUIREMENTS = 200
MAX_REQUIREMENT = 1000  # characters of one requirement string

RESERVED_NAMES = frozenset(
    {
        # GPUs and ranks (the runner; Slurm's array index, set by the agent)
        "CUDA_VISIBLE_DEVICES", "NVIDIA_VISIBLE_DEVICES", "NVIDIA_DRIVER_CAPABILITIES", "CUDA_HOME",
        "RANK", "LOCAL_RANK", "WORLD_SIZE", "SLURM_ARRAY_TASK_ID",
        "NODE_RANK", "NNODES", "LOCAL_WORLD_SIZE",  # the launchers' (docs/pytorch.md)
        # the process's own environment, as the runner sets it
        "PATH", "HOME", "TMPDIR", "LANG", "TZ", "PYTHONPATH", "PYTHONHOME", "PYTHONUNBUFFERED",
        "VIRTUAL_ENV",
    }
)  # fmt: skip
# Whole families: the rendezvous (MASTER_ADDR, MASTER_PORT...), the platform's own
# (GPUPLATFORM_*), and the dynamic loader's (LD_PRELOAD, LD_LIBRARY_PATH, LD_AUDIT...).
RESERVED_PREFIXES = ("MASTER_", "GPUPLATFORM_", "LD_")


def name_problem(name: str) -> str | None:
    """Why `name` cannot be an environment variable or secret name, or None."""
    if not NAME.fullmatch(name) or len(name) > MAX_NAME:
        return f"must match [A-Z_][A-Z0-9_]* (at most {MAX_NAME} characters)"
    if name in RESERVED_NAMES or name.startswith(RESERVED_PREFIXES):
        return "is set by the platform and cannot be set by a job"
    return None
