"""tiny-train: fit y = w*x + b to data.csv by gradient descent, in pure Python.

    gpuplatform submit --workdir examples/tiny-train --gpus 1 --wait -- python train.py --lr 0.1

What it shows, as a real training script would:
- its own data, shipped in the working directory (data.csv), read relative to the script;
- one requirement (`tinystats`, from requirements.txt), installed in the environment that the
  node builds for the job;
- a checkpoint every epoch through the job SDK (`gpuplatform_job`): a preempted run resumes
  where it stopped;
- an environment variable (TINY_TRAIN_NOTE, from `--env`) and a secret (TINY_TRAIN_TOKEN, from
  `--secret`), which it prints: the stored log shows the secret as ***;
- a result file (result.json) written where the platform collects artifacts;
- sweeps: in a job array, `--sweep sweep.json` takes its settings from the entry at
  GPUPLATFORM_ARRAY_INDEX (and template-style params from GPUPLATFORM_PARAMS win over both).

It also runs on a laptop (`python train.py`), writing under ./output and ./checkpoints.
"""

import argparse
import csv
import json
import os
import pathlib
import sys
import time

import tinystats

try:
    from gpuplatform_job import (
        install_checkpoint_handler,
        output_dir,
        params,
        report_progress,
        resume_from,
        save_checkpoint,
        stop_requested,
    )
except ImportError:  # not on the platform: the same calls, on local files
    _HERE = pathlib.Path.cwd()

    def install_checkpoint_handler():
        pass

    def stop_requested():
        return False

    def params():
        return {}

    def report_progress(fraction, *, step=None, message=""):
        pass

    def output_dir():
        (_HERE / "output").mkdir(exist_ok=True)
        return _HERE / "output"

    def save_checkpoint(state, name="checkpoint.json"):
        (_HERE / "checkpoints").mkdir(exist_ok=True)
        (_HERE / "checkpoints" / name).write_text(json.dumps(state))

    def resume_from():
        path = _HERE / "checkpoints" / "checkpoint.json"
        return json.loads(path.read_text()) if path.exists() else None


HERE = pathlib.Path(__file__).resolve().parent


def settings() -> dict:
    parser = argparse.ArgumentParser()
    parser.add_argument("--lr", type=float, default=0.1)
    parser.add_argument(
        "--epochs", type=int, default=int(os.environ.get("TINY_TRAIN_EPOCHS", "20"))
    )
    parser.add_argument(
        "--epoch-seconds", type=float, default=0.05, help="sleep per epoch (to watch it)"
    )
    parser.add_argument(
        "--sweep", help="a JSON list of settings; this task takes the entry at its array index"
    )
    args = parser.parse_args()
    chosen = {"lr": args.lr, "epochs": args.epochs, "epoch_seconds": args.epoch_seconds}
    index = os.environ.get("GPUPLATFORM_ARRAY_INDEX")
    if args.sweep and index is not None:
        sweep = json.loads((HERE / args.sweep).read_text())
        chosen.update(sweep[int(index) % len(sweep)])
    chosen.update({k: v for k, v in params().items() if k in chosen})
    chosen["array_index"] = int(index) if index is not None else None
    return chosen


def load() -> tuple[list[float], list[float]]:
    with open(HERE / "data.csv", newline="") as handle:
        rows = list(csv.DictReader(handle))
    return [float(r["x"]) for r in rows], [float(r["y"]) for r in rows]


def main() -> int:
    install_checkpoint_handler()
    s = settings()
    xs, ys = load()
    zs, (x_mean, x_std) = tinystats.zscores(xs)
    print(f"tiny-train: {len(xs)} rows from data.csv; tinystats {tinystats.__version__} from "
          f"{pathlib.Path(tinystats.__file__).parent}", flush=True)  # fmt: skip
    print(f"tiny-train: note={os.environ.get('TINY_TRAIN_NOTE', '')!r} "
          f"token={os.environ.get('TINY_TRAIN_TOKEN', '(none)')}", flush=True)  # fmt: skip
    state = resume_from() or {"epoch": 0, "w": 0.0, "b": 0.0}
    start = state["epoch"]
    if start:
        print(f"tiny-train: resuming from the checkpoint of epoch {start}", flush=True)
    w, b, n = state["w"], state["b"], len(zs)
    loss = float("nan")
    for epoch in range(start, s["epochs"]):
        time.sleep(s["epoch_seconds"])
        errors = [w * z + b - y for z, y in zip(zs, ys, strict=True)]
        loss = sum(e * e for e in errors) / n
        w -= s["lr"] * 2 * sum(e * z for e, z in zip(errors, zs, strict=True)) / n
        b -= s["lr"] * 2 * sum(errors) / n
        save_checkpoint({"epoch": epoch + 1, "w": w, "b": b})
        report_progress((epoch + 1) / s["epochs"], step=epoch + 1)
        print(f"epoch {epoch + 1}/{s['epochs']} loss={loss:.4f}", flush=True)
        if stop_requested():
            print(
                f"tiny-train: checkpointed at epoch {epoch + 1}, stopping for preemption",
                flush=True,
            )
            return 0
    slope, intercept = w / x_std, b - w * x_mean / x_std  # back to data.csv's units
    result = {"slope": slope, "intercept": intercept, "loss": loss, "lr": s["lr"],
              "epochs": s["epochs"], "resumed_from_epoch": start, "array_index": s["array_index"]}  # fmt: skip
    (output_dir() / "result.json").write_text(json.dumps(result, indent=2))
    print(f"tiny-train: y = {slope:.3f} x + {intercept:.3f} (loss {loss:.4f})", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
