"""demo-train: a checkpointing training loop. Resumes from its last step, reports progress
every step, fails on purpose at `fail_at_step`, writes result.json at the end."""

import json
import os
import sys
import time

from gpuplatform_job import (
    install_checkpoint_handler,
    output_dir,
    params,
    report_progress,
    resume_from,
    save_checkpoint,
    stop_requested,
)

CHECKPOINTED_EXIT = 0  # a preempted job that checkpointed exits cleanly
GANG_ENV = (
    "RANK",
    "LOCAL_RANK",
    "WORLD_SIZE",
    "MASTER_ADDR",
    "MASTER_PORT",
)  # torch.distributed's rendezvous


def main() -> int:
    install_checkpoint_handler()
    p = params()
    steps, step_seconds, fail_at = (
        p.get("steps", 10),
        p.get("step_seconds", 0.1),
        p.get("fail_at_step"),
    )
    state = resume_from() or {"step": 0}
    start = state["step"]
    gang = " ".join(f"{name}={os.environ.get(name, '')}" for name in GANG_ENV)
    print(f"demo-train: {gang} pid={os.getpid()}", flush=True)
    print(
        f"demo-train: steps={steps} starting at step {start} CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES')}",
        flush=True,
    )
    for step in range(start, steps):
        if fail_at is not None and step == fail_at:
            print(f"demo-train: failing on purpose at step {step}", flush=True)
            return 3
        time.sleep(step_seconds)
        save_checkpoint({"step": step + 1})
        report_progress((step + 1) / steps, step=step + 1)
        print(f"step {step + 1}/{steps} loss={1.0 / (step + 1):.4f}", flush=True)
        if stop_requested():
            print(
                f"demo-train: checkpointed at step {step + 1}, exiting for preemption", flush=True
            )
            return CHECKPOINTED_EXIT
    result = {
        "steps": steps,
        "resumed_from_step": start,
        "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
        "rank": int(os.environ.get("RANK", "0")),
        "world_size": int(os.environ.get("WORLD_SIZE", "1")),
        "master_addr": os.environ.get("MASTER_ADDR", ""),
        "master_port": os.environ.get("MASTER_PORT", ""),
    }
    (output_dir() / "result.json").write_text(json.dumps(result, indent=2))
    print("demo-train: done", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
