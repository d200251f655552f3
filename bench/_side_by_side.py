"""bench.foundation's measurements from two checkouts, interleaved, with each platform process's CPU.

    python bench/_side_by_side.py BASE_TREE NEW_TREE [--rounds 2] [--out results.jsonl]
    python bench/_side_by_side.py --one TREE WHAT N DATA_DIR      (one measurement; what it runs)

Not part of `make bench` (it needs two checkouts). Run as a script, not with -m: each measurement runs in a fresh interpreter from its own tree (`cwd` and `sys.path` there, so
each tree's own bench/foundation.py, tests/e2e/platform.py and code), base, new, base, new, ...,
each tree: latency 20, throughput 200, peer 100 (bench.foundation's --quick shapes). Besides the
figures, it records the CPU seconds each platform process used (the web with its workers, the
dispatcher, the agents with the jobs they ran: itself, its reaped children and its live
descendants with theirs, such as an agent's fork server and the jobs it reaped), read just
before the platform stops. docs/bench/13-drain.md has a run of it.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import subprocess
import sys
import tempfile
import time

SHAPES = (("latency", 20), ("throughput", 200), ("peer", 100))


def one(tree: str, what: str, n: int, data_dir: pathlib.Path) -> dict:
    os.chdir(tree)
    sys.path.insert(0, tree)
    os.environ.setdefault("SECRET_KEY", "bench-only")
    import psutil

    from bench import foundation
    from tests.e2e import platform as e2e

    cpu: dict[str, float] = {}
    real_stop = e2e.Platform.stop

    def cpu_of(pid: int) -> float | None:
        try:
            process = psutil.Process(pid)
            times = process.cpu_times()
            total = times.user + times.system + times.children_user + times.children_system
            for child in process.children(recursive=True):
                try:
                    child_times = child.cpu_times()
                    # Its reaped children too: an agent's fork server reaps the jobs it forked.
                    total += child_times.user + child_times.system
                    total += child_times.children_user + child_times.children_system
                except psutil.Error:
                    pass
            return total
        except psutil.Error:
            return None

    def stop(self):
        for name, process in self.processes.items():
            kind = "agent" if name.startswith("agent") else name
            value = cpu_of(process.pid)
            if value is not None:
                cpu[kind] = round(cpu.get(kind, 0) + value, 2)
        real_stop(self)

    e2e.Platform.stop = stop
    data_dir.mkdir(parents=True, exist_ok=True)
    began = time.time()
    measure = {"latency": foundation.latency, "throughput": foundation.throughput,
               "peer": foundation.peer_drain}[what]  # fmt: skip
    result = measure(n, data_dir)
    if "retried" in result:
        result["retried"] = len(result["retried"])
    result.update(tree=tree, what=what, wall=round(time.time() - began, 1), cpu=cpu)
    return result


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("trees", nargs="*")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--out", default="side_by_side.jsonl")
    parser.add_argument("--one", nargs=4, metavar=("TREE", "WHAT", "N", "DATA_DIR"))
    args = parser.parse_args()
    if args.one:
        tree, what, n, data_dir = args.one
        print("RESULT " + json.dumps(one(tree, what, int(n), pathlib.Path(data_dir))), flush=True)
        return 0
    with open(args.out, "a") as out:
        for round_ in range(1, args.rounds + 1):
            for tree in args.trees:
                for what, n in SHAPES:
                    load = os.getloadavg()[0]
                    with tempfile.TemporaryDirectory(prefix="gpuplatform-side-") as tmp:
                        answer = subprocess.run(
                            [sys.executable, __file__, "--one", tree, what, str(n), tmp],
                            capture_output=True, text=True,
                        )  # fmt: skip
                    lines = [x for x in answer.stdout.splitlines() if x.startswith("RESULT ")]
                    if not lines:
                        print(f"{tree} {what}: no result\n{answer.stderr[-2000:]}", file=sys.stderr)
                        continue
                    result = {
                        "round": round_,
                        "load": load,
                        **json.loads(lines[-1][len("RESULT ") :]),
                    }
                    out.write(json.dumps(result) + "\n")
                    out.flush()
                    print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
