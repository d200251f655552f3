"""Placement core benchmarks: placement throughput with and without the indexes, and the FGD
protocol on the Alibaba openb trace beside the published table.

    python -m bench.placement            # full run (about 3 CPU-minutes; 9 wall-minutes when shared)
    python -m bench.placement --quick    # smaller, for a smoke test
    python -m bench.placement --only fgd --seeds 42 43

Writes docs/bench/20-placement.md (the full run; `--quick` writes it too, marked as quick).
"""

from __future__ import annotations

import argparse
import csv
import os
import pathlib
import platform
import random
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass

from apps.scheduling.core import MILLI, ClusterManager, Node, Pod, Strategy, Workload
from apps.scheduling.core.strategies import FGD, FGDPlus

ROOT = pathlib.Path(__file__).resolve().parent.parent
SECTION = ROOT / "docs" / "bench" / "20-placement.md"
OPENB = "alibaba-fgd-openb"
POINTS = (80, 90, 100, 110, 130)
# The three openb pod lists issue 18 asks the default to match FGD on; the others (default)
# run only the strategies that matter there, to keep the run short.
POD_LISTS = {
    "default": "openb_pod_list_default.csv",
    "gpuspec33": "openb_pod_list_gpuspec33.csv",
    "multigpu50": "openb_pod_list_multigpu50.csv",
}
OTHER_LIST_STRATEGIES = (
    "best-fit (replica of the artifact's)",
    "fgd (replica of the artifact's)",
    "fgd-plus, quantum 50 (the default before issue 18)",
    "fgd-plus (default; learns the mix online)",
)
ARTIFACT_POLICIES = {"01-Random": "Random", "05-BestFit": "Best-fit", "06-FGD": "FGD"}


def published(pod_list: str) -> dict[str, dict[int, float]]:
    """The artifact's expected results for one pod list, mean of its 10 seeds, at POINTS."""
    import gzip

    path = traces_dir() / OPENB / "published-results" / "analysis_allo_discrete.csv.gz"
    runs: dict[str, list[dict[str, str]]] = {}
    with gzip.open(path, "rt", newline="") as f:
        for row in csv.DictReader(f):
            if row["workload"] == pathlib.Path(POD_LISTS[pod_list]).stem:
                if row["sc_policy"] in ARTIFACT_POLICIES:
                    runs.setdefault(ARTIFACT_POLICIES[row["sc_policy"]], []).append(row)
    return {
        name: {p: statistics.fmean(float(r[str(p)]) for r in rows) for p in POINTS}
        for name, rows in runs.items()
    }


def traces_dir() -> pathlib.Path:
    """`GPUPLATFORM_TRACES`, else `shared/traces` beside the repository."""
    return pathlib.Path(os.environ.get("GPUPLATFORM_TRACES") or ROOT.parent / "shared" / "traces")


# ----------------------------------------------------------------------------- throughput


class ScanFirstFit:
    """The baseline: look at every node for every pod, take the first that fits by name.

    Plain lists, no indexes: what a straightforward implementation does. `early_exit=True`
    stops at the first fitting node instead of filtering them all.
    """

    def __init__(self, nodes: list[Node], early_exit: bool = False) -> None:
        self.early_exit = early_exit
        ordered = sorted(nodes, key=lambda n: n.name)
        self.names = [n.name for n in ordered]
        self.free = [[MILLI] * n.gpus for n in ordered]
        self.cpu = [n.cpu_milli for n in ordered]
        self.mem = [n.memory_mib for n in ordered]
        self.pods: dict[str, tuple[int, list[int], Pod]] = {}
        self.index = {name: i for i, name in enumerate(self.names)}

    def add_pod(self, pod: Pod, placement) -> None:
        """Take an allocation decided elsewhere (the shared starting state)."""
        [a] = placement.assignments
        i = self.index[a.node]
        for g in a.gpu_indices:
            self.free[i][g] -= pod.gpu_milli
        self.cpu[i] -= pod.cpu_milli
        self.mem[i] -= pod.memory_mib
        self.pods[pod.name] = (i, list(a.gpu_indices), pod)

    def fits(self, i: int, pod: Pod) -> bool:
        if self.cpu[i] < pod.cpu_milli or self.mem[i] < pod.memory_mib:
            return False
        m = pod.gpu_milli
        return sum(1 for f in self.free[i] if f >= m) >= pod.gpus

    def schedule_pod(self, pod: Pod):
        fitting = []
        for i in range(len(self.names)):
            if self.fits(i, pod):
                fitting.append(i)
                if self.early_exit:
                    break
        if not fitting:
            return None
        i = fitting[0]
        gpus = [g for g, f in enumerate(self.free[i]) if f >= pod.gpu_milli][: pod.gpus]
        for g in gpus:
            self.free[i][g] -= pod.gpu_milli
        self.cpu[i] -= pod.cpu_milli
        self.mem[i] -= pod.memory_mib
        self.pods[pod.name] = (i, gpus, pod)
        return self.names[i]

    def remove_pod(self, name: str) -> None:
        i, gpus, pod = self.pods.pop(name)
        for g in gpus:
            self.free[i][g] += pod.gpu_milli
        self.cpu[i] += pod.cpu_milli
        self.mem[i] += pod.memory_mib


def synthetic_nodes(n: int) -> list[Node]:
    return [
        Node(
            f"node-{i:05}",
            8,
            "H100",
            cpu_milli=128_000,
            memory_mib=1_048_576,
            labels={"rack": f"r{i // 32:03}"},
        )
        for i in range(n)
    ]


# (weight, gpus, gpu_milli, cpu per pod): a mix of whole-GPU jobs, GPU shares and CPU-only pods.
MIX = [(40, 1, 1000, 8000), (15, 2, 1000, 16000), (10, 4, 1000, 32000), (5, 8, 1000, 64000)]
MIX += [(15, 1, 500, 4000), (10, 1, 250, 2000), (5, 0, 1000, 2000)]


def synthetic_pods(rng: random.Random, count: int, prefix: str) -> list[Pod]:
    weights = [m[0] for m in MIX]
    pods = []
    for i in range(count):
        _, gpus, milli, cpu = rng.choices(MIX, weights)[0]
        pods.append(
            Pod(
                f"{prefix}{i}",
                gpus=gpus,
                gpu_milli=milli,
                cpu_milli=cpu,
                memory_mib=8192 * max(gpus, 1),
            )
        )
    return pods


@dataclass
class Rate:
    name: str
    nodes: int
    rates: list[float]  # placements per second, one per repeat
    placed: float  # share of schedule calls that placed the pod

    @property
    def median(self) -> float:
        return statistics.median(self.rates)


def busy_state(n_nodes: int, seed: int = 7) -> tuple[list[Node], list[tuple[Pod, object]]]:
    """Nodes and a set of allocations filling ~85% of their GPUs (found with indexed first-fit,
    so building it costs little), from which every contender starts."""
    rng = random.Random(seed)
    nodes = synthetic_nodes(n_nodes)
    cm = make_manager("first-fit")(nodes)
    used, misses, counter = 0, 0, 0
    while used < 0.85 * MILLI * 8 * n_nodes and misses < 100:
        counter += 1
        pod = synthetic_pods(rng, 1, f"fill{counter}-")[0]
        if cm.schedule_pod(pod) is None:
            misses += 1
        else:
            used += pod.gpus * pod.gpu_milli
    return nodes, [(pod, cm.placement_of(pod.name)) for pod in cm.list_pods()]


def churn_rate(
    make, nodes: list[Node], allocations, per_repeat: int, repeats: int, seed: int = 11
) -> Rate:
    """From the busy state, time `schedule_pod` while pods come and go.

    Timed in CPU time of this thread (`time.thread_time`), not wall time: the development
    machine is shared, and other processes' load should not count against a contender.

    Before each timed call, if allocated GPUs exceed 85%, random pods leave (untimed), so
    every contender works on a busy, fragmented cluster. Same pod stream for everyone.
    """
    rng = random.Random(seed)
    cm = make(nodes)
    for pod, placement in allocations:
        cm.add_pod(pod, placement)
    capacity = MILLI * sum(n.gpus for n in nodes)
    live = [pod for pod, _ in allocations]
    used = sum(p.gpus * p.gpu_milli for p in live)
    rates, placed, calls = [], 0, 0
    for r in range(repeats):
        spent = 0.0
        for i in range(per_repeat):
            while used > 0.85 * capacity and live:
                k = rng.randrange(len(live))
                live[k], live[-1] = live[-1], live[k]
                gone = live.pop()
                cm.remove_pod(gone.name)
                used -= gone.gpus * gone.gpu_milli
            pod = synthetic_pods(rng, 1, f"r{r}-{i}-")[0]
            t0 = time.thread_time()
            ok = cm.schedule_pod(pod) is not None
            spent += time.thread_time() - t0
            calls += 1
            if ok:
                placed += 1
                live.append(pod)
                used += pod.gpus * pod.gpu_milli
        rates.append(per_repeat / spent)
    return Rate("", len(nodes), rates, placed / calls)


def make_manager(strategy: str) -> Callable[[list[Node]], ClusterManager]:
    def make(nodes: list[Node]) -> ClusterManager:
        cm = ClusterManager(strategy)
        for node in nodes:
            cm.add_node(node)
        return cm

    return make


def make_scan(early_exit: bool) -> Callable[[list[Node]], ScanFirstFit]:
    return lambda nodes: ScanFirstFit(nodes, early_exit)


THROUGHPUT_STRATEGIES = ["first-fit", "best-fit", "bin-pack", "spread", "fgd-plus"]


def throughput(sizes: list[int], per_repeat: dict[int, int], repeats: int) -> list[Rate]:
    results = []
    for n in sizes:
        nodes, allocations = busy_state(n)
        runs = [(s, make_manager(s)) for s in THROUGHPUT_STRATEGIES]
        runs += [
            ("scan first-fit (all nodes)", make_scan(False)),
            ("scan first-fit (stop at first)", make_scan(True)),
        ]
        for name, make in runs:
            count = per_repeat[n] if not name.startswith("scan") else max(20, per_repeat[n] // 50)
            t0 = time.perf_counter()
            rate = churn_rate(make, nodes, allocations, count, repeats)
            rate.name = name
            results.append(rate)
            print(
                f"  {n:>6} nodes  {name:<32} {rate.median:>10.0f}/s  ({time.perf_counter() - t0:.1f}s)",
                flush=True,
            )
    return results


# ----------------------------------------------------------------------------- the lock


@dataclass
class LockRow:
    strategy: str
    variant: str
    rate: float  # schedule+remove pairs per second, all threads together


def lock_numbers(n_nodes: int, pairs: int, rounds: int) -> tuple[float, list[LockRow]]:
    """What the one global lock costs, and what 16 threads get through it.

    Each op is a `schedule_pod` then `remove_pod` of that pod (the state stays busy and the
    same). Variants: one thread with the lock, one thread with the lock swapped for a no-op
    (unsafe; measurement only), 16 threads sharing the lock. Rates are per CPU-second of the
    process (`time.process_time`, all threads), best of `rounds` interleaved rounds (as
    `timeit` does): interference from other load only ever slows a round down.
    """
    import contextlib
    import threading
    import timeit

    rlock = threading.RLock()

    def acquire_release():
        with rlock:
            pass

    lock_ns = min(timeit.repeat(acquire_release, number=100_000, repeat=5)) / 100_000 * 1e9
    nodes, allocations = busy_state(n_nodes)
    variants = (
        ("1 thread, lock", 1, True),
        ("1 thread, no lock", 1, False),
        ("16 threads, lock", 16, True),
    )
    samples: dict[tuple[str, str], list[float]] = {}
    for _ in range(rounds):  # interleaved rounds, the best kept: the machine is shared
        for strategy in ("first-fit", "fgd-plus"):
            for variant, threads, locked in variants:
                cm = make_manager(strategy)(nodes)
                for pod, placement in allocations:
                    cm.add_pod(pod, placement)
                if not locked:
                    cm._lock = contextlib.nullcontext()
                pods = synthetic_pods(random.Random(5), pairs, "lock")
                chunks = [pods[t::threads] for t in range(threads)]

                def work(chunk, cm=cm):
                    for pod in chunk:
                        if cm.schedule_pod(pod) is not None:
                            cm.remove_pod(pod.name)

                workers = [threading.Thread(target=work, args=(c,)) for c in chunks]
                t0 = time.perf_counter()
                for w in workers:
                    w.start()
                for w in workers:
                    w.join()
                samples.setdefault((strategy, variant), []).append(
                    pairs / (time.perf_counter() - t0)
                )
                cm.verify()
    rows = [LockRow(s, v, max(r)) for (s, v), r in samples.items()]
    for r in rows:
        print(f"  {r.strategy:<10} {r.variant:<18} {r.rate:>9.0f} pairs/s", flush=True)
    return lock_ns, rows


# ----------------------------------------------------------------------------- FGD protocol


def load_openb(directory: pathlib.Path, pod_file: str = "openb_pod_list_default.csv"):
    with open(directory / "openb_node_list_gpu_node.csv", newline="") as f:
        nodes = [
            Node(r["sn"], int(r["gpu"]), r["model"], int(r["cpu_milli"]), int(r["memory_mib"]))
            for r in csv.DictReader(f)
        ]
    with open(directory / pod_file, newline="") as f:
        pods = []
        for r in csv.DictReader(f):
            gpus = int(r["num_gpu"])
            spec = tuple(sorted(set(filter(None, (r.get("gpu_spec") or "").split("|")))))
            pods.append(
                Pod(
                    r["name"],
                    gpus=gpus,
                    gpu_milli=int(r["gpu_milli"]) if gpus else MILLI,
                    cpu_milli=int(r["cpu_milli"]),
                    memory_mib=int(r["memory_mib"]),
                    gpu_models=spec,
                )
            )
    return nodes, pods


def inflated(pods: list[Pod], capacity: int, seed: int, ratio: float = 1.3) -> list[Pod]:
    """Shuffle, then append random clones until the GPU asked for would pass ratio x capacity;
    a list that asks for more than that already (multigpu50: about 1.83x) loses random pods
    until it does not (the artifact's protocol, SOURCE.md)."""
    rng = random.Random(seed)
    order = list(pods)
    rng.shuffle(order)
    total = sum(p.gpus * p.gpu_milli for p in order)
    if total > ratio * capacity:
        while total > ratio * capacity:
            dropped = order.pop(rng.randrange(len(order)))
            total -= dropped.gpus * dropped.gpu_milli
        return order
    clones = 0
    while True:
        source = rng.choice(pods)
        if total + source.gpus * source.gpu_milli > ratio * capacity:
            break
        clones += 1
        total += source.gpus * source.gpu_milli
        order.append(_clone(source, f"{source.name}-clone{clones}"))
    return order


def _clone(pod: Pod, name: str) -> Pod:
    return Pod(
        name,
        gpus=pod.gpus,
        gpu_milli=pod.gpu_milli,
        cpu_milli=pod.cpu_milli,
        memory_mib=pod.memory_mib,
        gpu_models=pod.gpu_models,
    )


def artifact_workload(pods: list[Pod]) -> Workload:
    """The artifact's typical pods: the most frequent (cpu, gpu milli, gpu count, model) types
    covering 95% of pods, CPU-only pods included."""
    return Workload.from_pods(pods, coverage=0.95, include_cpu=True)


class ScanRandom(ScanFirstFit):
    """Reference only (the published Random-fit): a uniformly random fitting node, and a random
    GPU with room for a share."""

    def __init__(self, nodes: list[Node], seed: int) -> None:
        super().__init__(nodes)
        self.rng = random.Random(seed)
        self.models = [n.gpu_model for n in sorted(nodes, key=lambda n: n.name)]
        self.order = list(range(len(self.names)))

    def schedule_pod(self, pod: Pod):
        # A lazy Fisher-Yates shuffle: draw nodes without replacement until one fits, which is
        # a uniform pick among the fitting nodes without testing all of them.
        order, n = self.order, len(self.names)
        for j in range(n):
            k = self.rng.randrange(j, n)
            order[j], order[k] = order[k], order[j]
            i = order[j]
            if self.fits(i, pod) and (
                not pod.gpus or not pod.gpu_models or self.models[i] in pod.gpu_models
            ):
                break
        else:
            return None
        roomy = [g for g, f in enumerate(self.free[i]) if f >= pod.gpu_milli]
        gpus = self.rng.sample(roomy, pod.gpus) if pod.gpu_milli < MILLI else roomy[: pod.gpus]
        for g in gpus:
            self.free[i][g] -= pod.gpu_milli
        self.cpu[i] -= pod.cpu_milli
        self.mem[i] -= pod.memory_mib
        return self.names[i]


class ArtifactBestFit(FGD):
    """Reference only: the artifact's BestFit score, to show the harness reproduces its table.

    Score = int(100 x (1 - 0.5 x CPU left / 128 cores - 0.5 x GPU left / 8 GPUs)) (min-max
    normalisation after it keeps the order), ties to the smaller node name; a share goes to the
    tightest GPU.
    """

    name = "artifact-best-fit"

    def _class_score(self, model, shape, cpu_free, pod) -> tuple:
        left = (
            0.5 * (cpu_free - pod.cpu_milli) / 128_000
            + 0.5 * (sum(shape) - pod.gpus * pod.gpu_milli) / 8000
        )
        tight = min((v for v in shape if v >= pod.gpu_milli), default=0)
        return (-int((1 - left) * 100), (tight,))


def fgd_run(nodes: list[Node], order: list[Pod], strategy) -> dict[int, float]:
    """Place `order` one by one, none leaving; allocation % at each arrived % (rounded)."""
    if callable(strategy) and not isinstance(strategy, Strategy):
        cm = strategy(nodes)
    else:
        cm = ClusterManager(strategy)
        for node in nodes:
            cm.add_node(node)
    capacity = MILLI * sum(n.gpus for n in nodes)
    arrived = allocated = 0
    samples: dict[int, list[float]] = {}
    for pod in order:
        ask = pod.gpus * pod.gpu_milli
        arrived += ask
        if cm.schedule_pod(pod) is not None:
            allocated += ask
        samples.setdefault(int(100 * arrived / capacity + 0.5), []).append(
            100 * allocated / capacity
        )
    return {pct: statistics.fmean(v) for pct, v in samples.items()}


FGD_STRATEGIES: dict[str, Callable] = {
    "random-fit (replica of the artifact's)": lambda pods, seed: lambda nodes: ScanRandom(
        nodes, seed
    ),
    "best-fit (replica of the artifact's)": lambda pods, seed: ArtifactBestFit(
        artifact_workload(pods)
    ),
    "fgd (replica of the artifact's)": lambda pods, seed: FGD(artifact_workload(pods)),
    "first-fit": lambda pods, seed: "first-fit",
    "best-fit": lambda pods, seed: "best-fit",
    "bin-pack": lambda pods, seed: "bin-pack",
    "spread": lambda pods, seed: "spread",
    "fgd (learns the mix online)": lambda pods, seed: "fgd",
    "fgd-plus, given the trace mix": lambda pods, seed: FGDPlus(artifact_workload(pods)),
    "fgd-plus, quantum 50 (the default before issue 18)": lambda pods, seed: FGDPlus(quantum=50),
    "fgd-plus (default; learns the mix online)": lambda pods, seed: "fgd-plus",
}


def fgd_protocol(
    seeds: list[int], names: list[str] | None = None, pod_list: str = "default"
) -> dict[str, dict[int, float]]:
    nodes, pods = load_openb(traces_dir() / OPENB, POD_LISTS[pod_list])
    capacity = MILLI * sum(n.gpus for n in nodes)
    results: dict[str, dict[int, list[float]]] = {}
    for name in names or list(FGD_STRATEGIES):
        t0 = time.perf_counter()
        for seed in seeds:
            order = inflated(pods, capacity, seed)
            curve = fgd_run(nodes, order, FGD_STRATEGIES[name](order, seed))
            for pct in POINTS:
                results.setdefault(name, {}).setdefault(pct, []).append(
                    curve.get(pct, float("nan"))
                )
        at100 = statistics.fmean(results[name][100])
        print(
            f"  {pod_list}: {name:<26} @100% {at100:6.2f}  ({time.perf_counter() - t0:.1f}s)",
            flush=True,
        )
    return {
        name: {pct: statistics.fmean(v) for pct, v in by.items()} for name, by in results.items()
    }


# ----------------------------------------------------------------------------- report


def render(
    args,
    rates: list[Rate],
    fgd: dict[str, dict[str, dict[int, float]]],
    seeds: list[int],
    wall: float,
    lock=None,
) -> str:
    command = "python -m bench.placement" + (" --quick" if args.quick else "")
    out = ["## Placement core\n"]
    out.append(
        f"Machine: {platform.python_implementation()} {platform.python_version()}, {os.cpu_count()} CPUs. "
        f"Command: `{command}` ({wall / 60:.1f} min wall, {args.cpu_s / 60:.1f} min CPU){' — QUICK run, smaller samples' if args.quick else ''}.\n"
    )
    if rates:
        out.append("### Placements per second (single-node pods, busy cluster)\n")
        out.append(
            f"Command: `{command}`. Nodes of 8 H100s; the cluster is filled to 85% of its GPUs, then each "
            "timed `schedule_pod` is preceded (untimed) by random departures that keep it near 85%. "
            "Pod mix: 1/2/4/8 whole GPUs (40/15/10/5%), 0.5 and 0.25 GPU shares (15/10%), CPU-only (5%). "
            "Each call is timed in CPU time of the benchmark thread (`time.thread_time`, ~0.65 µs per reading, "
            "counted against every contender), so other load on the shared machine does not skew them. "
            "Rates are the median of "
            f"{args.repeats} repeats; every row below ran in this one process, side by side.\n"
        )
        out.append(
            "| nodes | placement | placements/s (median) | repeats | placed | vs scan-all first-fit |"
        )
        out.append("|---:|---|---:|---|---:|---:|")
        for n in sorted({r.nodes for r in rates}):
            scan = next(r for r in rates if r.nodes == n and r.name == "scan first-fit (all nodes)")
            for r in (r for r in rates if r.nodes == n):
                reps = ", ".join(f"{x:.0f}" for x in r.rates)
                out.append(
                    f"| {n:,} | {r.name} | {r.median:,.0f} | {reps} | {100 * r.placed:.0f}% | {r.median / scan.median:,.1f}x |"
                )
        out.append("")
    if lock:
        lock_ns, rows = lock
        out.append("### The global lock\n")
        out.append(
            f"Command: `{command}`. 1,000 busy nodes (as above); each op is `schedule_pod` then "
            "`remove_pod` of the same pod. An uncontended `threading.RLock` acquire+release costs "
            f"{lock_ns:.0f} ns here. 'no lock' swaps the lock for a no-op (unsafe; measurement only). "
            "Ops per CPU-second of the whole process, best of 7 interleaved rounds.\n"
        )
        out.append(
            "| strategy | variant | ops per CPU-second (all threads) | vs 1 thread with lock |"
        )
        out.append("|---|---|---:|---:|")
        for r in rows:
            base = next(
                x for x in rows if x.strategy == r.strategy and x.variant == "1 thread, lock"
            )
            out.append(
                f"| {r.strategy} | {r.variant} | {r.rate:,.0f} | {r.rate / base.rate:.2f}x |"
            )
        out.append("")
    if fgd:
        out.append("### FGD protocol on the Alibaba openb trace\n")
        out.append(
            f"Command: `{command}`. Protocol of `../shared/traces/{OPENB}/SOURCE.md`: a pod list "
            "shuffled with the seed, random clones appended until the GPU asked for would pass 1.3x "
            "capacity (multigpu50 asks for about 1.83x already: random pods are dropped until it "
            "asks for 1.3x), placed one by one on the 1,213 GPU nodes (6,212 GPUs), none leaving; GPU "
            "allocation % sampled after every pod, averaged over the samples whose arrived share "
            f"rounds to each column; mean of seeds {seeds[0]}-{seeds[-1]} ({len(seeds)} seeds). "
            "Python's `random` shuffles, so the pod orders differ from the artifact's Go runs. "
            "The published rows are the artifact's expected results (`published-results/`), mean of "
            "its seeds 42-51. The default's quantum (200) was chosen on seeds 1 and 2 of the three "
            "lists, never on the seeds reported here.\n"
        )
        out.append("| pod list | published FGD @100% | ours: default @100% | difference |")
        out.append("|---|---:|---:|---:|")
        default_name = "fgd-plus (default; learns the mix online)"
        for pod_list, results in fgd.items():
            ref = published(pod_list)["FGD"][100]
            ours = results[default_name][100]
            out.append(f"| {pod_list} | {ref:.2f} | {ours:.2f} | {ours - ref:+.2f} |")
        out.append("")
        for pod_list, results in fgd.items():
            out.append(f"#### `{POD_LISTS[pod_list]}`\n")
            out.append("| strategy | " + " | ".join(f"@{p}%" for p in POINTS) + " |")
            out.append("|---|" + "---:|" * len(POINTS))
            for name, by in published(pod_list).items():
                out.append(
                    f"| published {name} | " + " | ".join(f"{by[p]:.2f}" for p in POINTS) + " |"
                )
            for name, by in results.items():
                out.append(f"| ours: {name} | " + " | ".join(f"{by[p]:.2f}" for p in POINTS) + " |")
            out.append("")
    return "\n".join(out) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.placement")
    parser.add_argument("--quick", action="store_true", help="small samples, for a smoke test")
    parser.add_argument("--only", choices=["throughput", "fgd"], help="run one part")
    parser.add_argument(
        "--seeds", type=int, nargs="*", help="FGD seeds (default 42-51, quick 42-43)"
    )
    parser.add_argument(
        "--lists",
        nargs="*",
        choices=list(POD_LISTS),
        default=list(POD_LISTS),
        help="openb pod lists",
    )
    parser.add_argument("--no-write", action="store_true", help="print, do not write the section")
    args = parser.parse_args(argv)
    args.repeats = 3 if args.quick else 5
    seeds = args.seeds or (list(range(42, 44)) if args.quick else list(range(42, 52)))
    t0 = time.perf_counter()
    rates: list[Rate] = []
    fgd: dict[str, dict[str, dict[int, float]]] = {}
    if args.only in (None, "throughput"):
        print("placements per second", flush=True)
        sizes = [1000, 10000]
        per = {1000: 400, 10000: 400} if args.quick else {1000: 2000, 10000: 2000}
        rates = throughput(sizes, per, args.repeats)
    lock = None
    if args.only in (None, "throughput"):
        print("the lock", flush=True)
        lock = lock_numbers(1000, 2000 if args.quick else 4000, 3 if args.quick else 7)
    if args.only in (None, "fgd"):
        print(f"FGD protocol, seeds {seeds}", flush=True)
        for pod_list in args.lists:
            names = None if pod_list == "default" else list(OTHER_LIST_STRATEGIES)
            fgd[pod_list] = fgd_protocol(seeds, names, pod_list)
    args.cpu_s = time.process_time()
    text = render(args, rates, fgd, seeds, time.perf_counter() - t0, lock)
    print(text)
    if not args.no_write and args.only is None:
        SECTION.parent.mkdir(parents=True, exist_ok=True)
        SECTION.write_text(text)
        print(f"wrote {SECTION.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
