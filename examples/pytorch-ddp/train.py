"""A PyTorch DDP job that survives preemption: every member of the gang trains one replica of a
small model (gloo on CPU, NCCL where CUDA is), checkpoints every `--every` steps with
`torch.save` through the job SDK, stops at the same step on every rank when the platform asks it
to (preemption), and resumes from its own checkpoint in the job's next attempt, on whichever
nodes that runs. docs/pytorch.md explains it line by line.

    gpuplatform submit --gpus 1 --nodes 2 --requirement torch --workdir examples/pytorch-ddp \
        -- python train.py --steps 200
    gpuplatform submit ... -- python train.py --sharded   # a directory per rank instead of one file

Runs on a laptop too (`python train.py`: one process, world size 1).
"""

from __future__ import annotations

import argparse
import json
import os
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

try:  # the platform puts the job SDK on PYTHONPATH; on a laptop, run without it
    import gpuplatform_job as platform
except ImportError:  # pragma: no cover
    platform = None


def parse() -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--every", type=int, default=5, help="checkpoint every N steps")
    parser.add_argument("--step-seconds", type=float, default=0.0, help="a slower step, for demos")
    parser.add_argument("--sharded", action="store_true", help="a directory per rank (as FSDP's)")
    return parser.parse_args()


def save(model, optimizer, step: int, sharded: bool) -> None:
    state = {"model": model.module.state_dict(), "optimizer": optimizer.state_dict(), "step": step}
    if platform is None:
        return
    if sharded:  # many files per rank: each rank's own directory, packed by the SDK
        with platform.checkpoint_directory() as path:
            torch.save(state["model"], path / "model.pt")
            torch.save(state["optimizer"], path / "optimizer.pt")
            (path / "meta.json").write_text(json.dumps({"step": step}))
    else:  # one file per rank: any bytes
        with platform.checkpoint_file("checkpoint.pt") as handle:
            torch.save(state, handle)


def restore(model, optimizer) -> int:
    """The step to start from: 0, or the one this rank's last checkpoint was saved at."""
    if platform is None:
        return 0
    directory = platform.resume_dir()
    if directory is not None:
        model.module.load_state_dict(torch.load(directory / "model.pt", weights_only=True))
        optimizer.load_state_dict(torch.load(directory / "optimizer.pt", weights_only=True))
        return json.loads((directory / "meta.json").read_text())["step"]
    path = platform.resume_path()
    if path is None:
        return 0
    state = torch.load(path, weights_only=True)
    model.module.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    return state["step"]


def main() -> int:
    args = parse()
    cuda = torch.cuda.is_available()
    if "MASTER_ADDR" not in os.environ:  # a laptop: a gang of one
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT="29500", RANK="0", WORLD_SIZE="1")
    dist.init_process_group("nccl" if cuda else "gloo")  # env://: RANK, WORLD_SIZE, MASTER_*
    rank, world = dist.get_rank(), dist.get_world_size()
    device = (
        torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0))) if cuda else torch.device("cpu")
    )
    if platform is not None:
        platform.install_checkpoint_handler()  # the platform's checkpoint signal: stop_requested()

    torch.manual_seed(0)  # the same start on every rank (DDP also broadcasts rank 0's weights)
    model = DistributedDataParallel(torch.nn.Linear(8, 1).to(device))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    start = restore(model, optimizer)
    print(f"rank {rank}/{world} node_rank={os.environ.get('NODE_RANK')} starts at step {start}"
          f"{' (resumed)' if start else ''}", flush=True)  # fmt: skip

    generator = torch.Generator().manual_seed(1000 + rank)  # each rank its own data
    target = torch.arange(8, dtype=torch.float32).to(device)
    step = start
    while step < args.steps:
        x = torch.randn(32, 8, generator=generator).to(device)
        loss = ((model(x).squeeze(1) - x @ target) ** 2).mean()
        optimizer.zero_grad()
        loss.backward()  # gradients all-reduced across the gang here
        optimizer.step()
        step += 1
        time.sleep(args.step_seconds)
        # Stop on every rank at the same step: one asked (the platform's signal reaches the
        # members a moment apart) is all asked, or the others would wait in the next all-reduce.
        stop = torch.tensor([1.0 if platform and platform.stop_requested() else 0.0], device=device)
        dist.all_reduce(stop, op=dist.ReduceOp.MAX)
        if step % args.every == 0 or stop.item() or step == args.steps:
            save(model, optimizer, step, args.sharded)
        if rank == 0:
            if platform is not None:
                platform.report_progress(step / args.steps, step=step)
            if step % 10 == 0:
                print(f"step {step}/{args.steps} loss={loss.item():.4f}", flush=True)
        if stop.item():
            print(f"rank {rank}: checkpointed at step {step}, stopping for preemption", flush=True)
            dist.destroy_process_group()
            return 0

    if platform is not None:
        result = {"rank": rank, "world_size": world, "resumed_from_step": start, "steps": step,
                  "loss": loss.item(), "weights": model.module.weight.detach().cpu().flatten().tolist()}  # fmt: skip
        (platform.output_dir() / "result.json").write_text(json.dumps(result))
    print(f"rank {rank}: done at step {step} loss={loss.item():.4f}", flush=True)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
