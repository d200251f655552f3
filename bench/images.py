"""OCI images on the node (docs/images.md), through the agent's Runner as root (jobs fenced):

1. a cold pull and unpack of a ~500 MB image (busybox and 5 layers of 100 MB of random,
   incompressible bytes, built here with umoci and served by docker-registry on loopback), each
   run into an empty cache: the agent's own `pulled in Xs, unpacked in Ys` and launch to exit;
2. a warm start: a job on the cached image (`image <digest12> cached`), launch to exit;
3. the start overhead of a warm image job against the same job (`true`) with no image, run
   alternately on one agent, launch to exit (the medians, and the median of the pairs'
   differences). Target: at most 0.5 s.

`python -m bench.images` (as root, with `make images`' tools) writes docs/bench/57-images.md.
"""

from __future__ import annotations

import os
import pathlib
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parent.parent
OUT = ROOT / "docs" / "bench" / "57-images.md"
LAYERS, LAYER_MB = 5, 100
COLD_RUNS, WARM_RUNS = 3, 9
COMMAND = "nice python -m bench.images"


def build(workdir: pathlib.Path) -> pathlib.Path:
    """The busybox test image with LAYERS more layers of LAYER_MB random MB each."""
    from tests.oci_images import build_image

    layout = build_image(workdir / "image", marker="bench", env=["PATH=/bin"], cmd=["true"])
    for index in range(LAYERS):
        blob = workdir / f"blob-{index}"
        with open(blob, "wb") as out:
            for _ in range(LAYER_MB):
                out.write(os.urandom(10**6))
        subprocess.run(["umoci", "insert", "--image", f"{layout}:v1", str(blob),  # noqa: S603, S607
                        f"/data/blob-{index}"], check=True, capture_output=True)  # fmt: skip
        blob.unlink()
    return layout


def runner_at(data_dir: pathlib.Path):
    from tests.isolation.test_images import Reporter
    from workers.isolation import detect
    from workers.runner import Runner

    node = f"bench-img-{os.getpid()}"
    return Runner(node=node, data_dir=data_dir, reporter=Reporter(), kill_grace=1.0,
                  isolation=detect(node), fake_gpus=1)  # fmt: skip


_attempts = iter(range(1, 10**6))


def run(runner, argv: list[str], image: str = "") -> tuple[float, str]:
    """Launch to the reporter's `finished`: seconds, and the job's log."""
    from tests.isolation.conftest import log_of
    from tests.isolation.test_images import ImageJob

    attempt = next(_attempts)
    job = ImageJob(argv=argv, attempt_id=attempt, job_id=f"job-{attempt}", image=image,
                   gpu_indices=[0])  # fmt: skip
    began = time.monotonic()
    assert runner.launch(job)
    while True:
        runner.tick()
        done = [e for e in runner.reporter.events if e[0] == "finished" and e[3] == (attempt, 0)]
        if done:
            break
        time.sleep(0.002)
    took = time.monotonic() - began
    log = log_of(runner, (attempt, 0))
    if done[0][1:3] != (0, ""):
        raise SystemExit(f"job {attempt} failed: {done[0]}\n{log}")
    return took, log


def stop(runner) -> None:
    from tests.runners import stop_runner
    from workers.isolation import remove_node_groups

    stop_runner(runner, "bench over")
    remove_node_groups(runner.isolation.cgroups)


def missing() -> str:
    """Why this machine cannot run the bench ("" where it can)."""
    from tests.oci_images import BUSYBOX, TOOLS
    from workers.isolation import detect, remove_node_groups

    absent = [tool for tool in TOOLS if shutil.which(tool) is None]
    if absent or not os.path.exists(BUSYBOX):
        return f"`make images` first: missing {', '.join(absent) or BUSYBOX}"
    isolation = detect("bench-img-probe")
    remove_node_groups(isolation.cgroups)
    return "" if isolation.jailed else f"jobs cannot be fenced here ({isolation.reason})"


def measure(top: pathlib.Path) -> dict:
    from tests.oci_images import Registry

    began = time.monotonic()
    layout = build(top)
    built = time.monotonic() - began
    registry = Registry(top / "registry")
    try:
        registry.push(layout, "v1", "bench/big:v1")
        os.environ["GPUPLATFORM_INSECURE_REGISTRIES"] = registry.host
        image = f"{registry.host}/bench/big:v1"
        cold = []
        for index in range(COLD_RUNS):
            runner = runner_at(top / f"agent-{index}")
            took, log = run(runner, ["true"], image)
            found = re.search(r"pulling \S+ \(([\d.]+) MB.*pulled in ([\d.]+)s, unpacked in ([\d.]+)s",
                              log, re.DOTALL)  # fmt: skip
            assert found, log
            cold.append({"size_mb": float(found[1]), "pull": float(found[2]),
                         "unpack": float(found[3]), "total": took})  # fmt: skip
            if index < COLD_RUNS - 1:
                stop(runner)
                shutil.rmtree(top / f"agent-{index}", ignore_errors=True)
        plain, warm = [], []
        try:
            for _ in range(WARM_RUNS):  # alternately, so drift hits both alike
                plain.append(run(runner, ["true"])[0])
                took, log = run(runner, ["true"], image)
                assert " cached" in log, log
                warm.append(took)
        finally:
            stop(runner)
    finally:
        registry.stop()
    return {"built": built, "cold": cold, "plain": plain, "warm": warm}


def write(result: dict) -> None:
    cold, plain, warm = result["cold"], result["plain"], result["warm"]
    median = statistics.median
    pairs = [w - p for w, p in zip(warm, plain, strict=True)]
    pulls = ", ".join(f"{c['pull']:.2f}" for c in cold)
    unpacks = ", ".join(f"{c['unpack']:.2f}" for c in cold)
    rows = [
        ("image size (compressed, as its manifest says)", f"{cold[0]['size_mb']:.0f} MB in {LAYERS + 1} layers"),
        (f"cold pull (skopeo, loopback registry), median of {len(cold)}",
         f"{median(c['pull'] for c in cold):.2f} s ({pulls})"),
        (f"cold unpack (umoci), median of {len(cold)}",
         f"{median(c['unpack'] for c in cold):.2f} s ({unpacks})"),
        (f"cold job: launch to exit, median of {len(cold)}", f"{median(c['total'] for c in cold):.2f} s"),
        (f"warm job (image cached): launch to exit, median of {len(warm)}", f"{median(warm):.3f} s"),
        (f"the same job with no image: launch to exit, median of {len(plain)}", f"{median(plain):.3f} s"),
        ("warm start overhead: median of the pairs' differences (target <= 0.5 s)",
         f"{median(pairs):.3f} s (ratio of medians {median(warm) / median(plain):.2f}x)"),
    ]  # fmt: skip
    lines = [
        "## Images: cold pull and unpack, warm start\n",
        f"Command: `{COMMAND}` (as root: the agent's Runner in-process, jobs fenced with their own "
        "uid, cgroup and mount namespace; the registry Debian's docker-registry on loopback; all "
        "on the 2-core machine shared with other work). Building the image (not counted) took "
        f"{result['built']:.0f} s.\n",
        "| figure | value |",
        "|---|---|",
        *[f"| {name} | {value} |" for name, value in rows],
        "",
        "Pull and unpack times are the agent's own, from the lines it writes at the head of the "
        "job's log; launch-to-exit is `Runner.launch` to the reporter's `finished`, for `true`. "
        "The warm and the plain job run alternately on one agent; each warm job mounts its own "
        "overlay, /proc, /dev and /tmp and pivots into the image's root.\n",
    ]
    OUT.write_text("\n".join(lines))
    print("\n".join(lines))


def main() -> int:
    os.environ.setdefault("SECRET_KEY", "bench-only")
    sys.path.insert(0, str(ROOT))
    why = missing()
    if why:
        print(f"bench.images skipped: {why}")
        return 0
    with tempfile.TemporaryDirectory(prefix="bench-images-") as top:
        write(measure(pathlib.Path(top)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
