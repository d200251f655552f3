"""Sixteen threads hammer schedule_pod / remove_pod: no GPU share is ever handed out twice."""

import random
import sys
import threading
from collections import defaultdict

import pytest

from apps.scheduling.core import STRATEGIES, ClusterManager, Node, Pod

THREADS = 16
ROUNDS = 300


@pytest.fixture
def eager_switching():
    # Switch threads every microsecond instead of every 5 ms, so races get their chance.
    old = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    yield
    sys.setswitchinterval(old)


@pytest.mark.parametrize("strategy", ["best-fit", "fgd-plus", "first-fit"])
def test_sixteen_threads_never_over_allocate(strategy, eager_switching):
    assert strategy in STRATEGIES
    cm = ClusterManager(strategy)
    for i in range(12):
        cm.add_node(
            Node(
                f"n{i:02}",
                4,
                "H100",
                cpu_milli=32_000,
                memory_mib=100_000,
                labels={"rack": f"r{i % 3}"},
            )
        )
    held = {}  # pod name -> placement, as the threads saw them handed out
    held_lock = threading.Lock()
    errors = []
    start = threading.Barrier(THREADS)

    def worker(t):
        rng = random.Random(t)
        mine = []
        start.wait()
        try:
            for r in range(ROUNDS):
                if mine and rng.random() < 0.45:
                    name = mine.pop(rng.randrange(len(mine)))
                    with held_lock:
                        del held[name]
                    assert cm.remove_pod(name) is not None
                    continue
                pod = Pod(
                    f"t{t}-{r}",
                    gpus=rng.choice([1, 1, 2, 4]),
                    gpu_milli=rng.choice([1000, 1000, 500, 250]),
                    cpu_milli=rng.choice([0, 2000]),
                    nodes=rng.choice([1, 1, 1, 2]),
                )
                if pod.gpu_milli < 1000:
                    pod = Pod(pod.name, gpus=1, gpu_milli=pod.gpu_milli, cpu_milli=pod.cpu_milli)
                placement = cm.schedule_pod(pod)
                if placement is not None:
                    mine.append(pod.name)
                    with held_lock:
                        held[pod.name] = placement
                        check_no_gpu_over_held(held)
        except Exception as exc:  # reported in the main thread
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(t,)) for t in range(THREADS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors, errors[0]
    cm.verify()
    check_no_gpu_over_held(held)
    assert sorted(p.name for p in cm.list_pods()) == sorted(held)


def check_no_gpu_over_held(held):
    per_gpu = defaultdict(int)
    for placement in held.values():
        for a in placement.assignments:
            for i, m in zip(a.gpu_indices, a.gpu_milli, strict=True):
                per_gpu[(a.node, i)] += m
    over = {gpu: m for gpu, m in per_gpu.items() if m > 1000}
    assert not over, f"GPUs handed out beyond capacity: {over}"
