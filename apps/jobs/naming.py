"""A command job's default name: its script, not its interpreter (`python train.py` is `train`,
`torchrun --nproc_per_node 2 train.py` too, `python -m pkg.main` is `pkg.main`). The client
(client/gpuplatform_client/submit.py) follows the same rule and falls back to its workdir."""

from __future__ import annotations

# What runs a script rather than being one.
LAUNCHERS = {"python", "pypy", "torchrun", "accelerate", "deepspeed", "uv", "uvx", "poetry",
             "pipenv", "bash", "sh", "env", "mpirun", "srun", "launch", "run", "exec"}  # fmt: skip
SCRIPTS = ("py", "sh")


def command_name(argv: list[str]) -> str:
    """The script or module `argv` runs; else its program's base name."""
    words = iter(argv)
    for word in words:
        if word in ("-m", "-c"):
            module = next(words, "")
            if word == "-m" and module:
                return module
            break
        if word.startswith("-") or "=" in word:
            continue
        base = word.rstrip("/").rsplit("/", 1)[-1]
        stem, dot, suffix = base.rpartition(".")
        if dot and suffix in SCRIPTS and stem:
            return stem
        if base.isdigit() or base.rstrip("0123456789.") in LAUNCHERS:
            continue
        return base
    return argv[0].rsplit("/", 1)[-1] if argv else ""
