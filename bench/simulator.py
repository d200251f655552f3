"""bench.simulator: how fast the simulator runs the real policy, and how the policies compare.

`python -m bench.simulator [--quick]` writes docs/bench/30-simulator.md:
1. speed: the whole Philly trace (111,549 jobs) on 125 nodes x 8 GPUs = 1,000 GPUs with the
   default policy, in CPU seconds of the simulating process (the machine is shared, so wall time
   is shown too). Target: at most 60 s. `--quick` runs the first 20,000 jobs instead.
2. policies: ITP cluster04 on 69 x 8 = 552 GPUs (offered load about 0.9), 12 tenants, tier mix
   0.1/0.3/0.6, seed 1, default vs fifo vs strict vs slurm, with issue 4's targets. `--quick`
   runs the first 4,000 jobs.
3. autoscaling (issue 7): ITP cluster04, 8-GPU nodes, 5-minute provisioning lag, the default
   policy: a static cluster sized for the peak vs reactive vs predictive (burst share 3), with
   p50/p95 wait and paid GPU-hours. `--quick` runs the first 4,000 jobs.
Each figure comes from one command (shown), run as a subprocess; its summary.json is read back.
"""

from __future__ import annotations

import argparse
import json
import shlex
import subprocess
import sys
from pathlib import Path

from apps.scheduling.sim.cli import autoscale_table, table
from apps.scheduling.sim.report import targets_table

ROOT = Path(__file__).resolve().parent.parent
OUT_ARG = Path("var/bench/sim")  # relative to the repository root, as the commands show it
OUT = ROOT / OUT_ARG
SECTION = ROOT / "docs" / "bench" / "30-simulator.md"
POLICIES = "default,fifo,strict,slurm"


def run(argv: list[str]) -> str:
    command = ["python", "-m", "apps.scheduling.sim", *argv]
    print("$", shlex.join(command), flush=True)
    subprocess.run([sys.executable, *command[1:]], cwd=ROOT, check=True, stdout=subprocess.DEVNULL)
    return shlex.join(command)


def speed(quick: bool) -> tuple[str, dict]:
    argv = ["--format", "philly", "--nodes", "125", "--gpus-per-node", "8", "--policy", "default"]
    argv += ["--limit", "20000"] if quick else []
    argv += ["--no-files", "--out", str(OUT_ARG / "philly")]
    command = run(argv)
    return command, json.loads((OUT / "philly" / "summary.json").read_text())


def policies(quick: bool) -> tuple[str, dict[str, dict]]:
    argv = ["--format", "itp", "--trace", "cluster04", "--nodes", "69", "--gpus-per-node", "8"]
    argv += ["--tenants", "12", "--tier-mix", "enterprise=0.1,pro=0.3,free=0.6", "--seed", "1"]
    argv += ["--policy", POLICIES, "--no-files", "--out", str(OUT_ARG / "cluster04")]
    argv += ["--limit", "4000"] if quick else []
    command = run(argv)
    results = {
        p: json.loads((OUT / "cluster04" / p / "summary.json").read_text())
        for p in POLICIES.split(",")
    }
    return command, results


AUTOSCALE = "peak,reactive,predictive"


def autoscaling(quick: bool) -> tuple[str, dict[str, dict]]:
    argv = ["--format", "itp", "--trace", "cluster04", "--gpus-per-node", "8"]
    argv += ["--tenants", "12", "--tier-mix", "enterprise=0.1,pro=0.3,free=0.6", "--seed", "1"]
    argv += ["--autoscale", AUTOSCALE, "--provision-lag", "300", "--cooldown", "600"]
    argv += ["--burst-share", "3", "--no-files", "--out", str(OUT_ARG / "autoscale")]
    argv += ["--limit", "4000"] if quick else []
    command = run(argv)
    results = {
        m: json.loads((OUT / "autoscale" / m / "summary.json").read_text())
        for m in AUTOSCALE.split(",")
    }
    return command, results


def section(quick: bool) -> str:
    speed_cmd, philly = speed(quick)
    policy_cmd, results = policies(quick)
    scale_cmd, scaled = autoscaling(quick)
    peak = scaled["peak"]["autoscale"]
    cpu, wall = philly["cpu_seconds"], philly["wall_seconds"]
    jobs = philly["jobs"]
    met = "met" if cpu <= 60 else "not met"
    lines = [
        "## Simulator\n",
        "The discrete-event simulator (`python -m apps.scheduling.sim`) drives the real policy",
        "(`apps/scheduling/core/policy.py`) and placement core on public traces.",
        f"{'Quick run (`--quick`): trace slices only. ' if quick else ''}"
        "Times are CPU seconds of the simulating process (the machine is shared by several",
        "processes, so wall time is longer).\n",
        "### Speed: Philly on 1,000 GPUs\n",
        f"    {speed_cmd}\n",
        f"{jobs:,} jobs ({philly['finished']:,} finished) in **{cpu:.1f} s CPU** ({wall:.1f} s wall). "
        "Target for the whole trace (111,549 jobs): at most 60 s on one core: "
        f"{'not measured by `--quick` (a slice)' if quick else f'**{met}**'}.\n",
        "### Policies on ITP cluster04 (552 GPUs, offered load about 0.9)\n",
        f"    {policy_cmd}\n",
        table(results),
        targets_table(results),
        "### Autoscaling on ITP cluster04 (5-minute provisioning lag)\n",
        f"    {scale_cmd}\n",
        f"`peak` is a static cluster of {peak['peak_nodes']} x 8 GPUs: the most GPUs the jobs would "
        "hold at once if each started at its submission, in whole nodes. `reactive` and "
        "`predictive` start empty and grow up to that many nodes; predictive keeps room for 3x "
        "the recent burst (`--burst-share 3`). Paid GPU-hours count each node from its request "
        "(booting included) to its removal or the last job's end.\n",
        autoscale_table(scaled),
        "Definitions (wait, JCT, utilisation while jobs wait, Jain's fairness, the aging bound,",
        "GPU-hours lost, paid GPU-hours) are in `apps/scheduling/sim/report.py` and",
        "docs/scheduling.md.\n",
    ]
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.simulator")
    parser.add_argument("--quick", action="store_true", help="trace slices instead of whole traces")
    args = parser.parse_args()
    text = section(args.quick)
    SECTION.parent.mkdir(parents=True, exist_ok=True)
    SECTION.write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
