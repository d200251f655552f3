"""On a machine with an NVIDIA GPU and its driver (skipped elsewhere, with NVML's answer as the
reason): a job in a busybox image, fenced, given GPU 0, runs the host's `nvidia-smi` from the
driver bound into its root (workers/image_driver.py) and sees that GPU only, by its UUID.

The image is built here (tests/oci_images.py): busybox, plus the host's C library files that
`ldd` names for nvidia-smi (busybox-static has none), served by docker-registry on loopback."""

from __future__ import annotations

import pathlib
import re
import shutil
import subprocess
import time

import pytest

from tests.gpu.test_real_gpu import nvml_inventory
from tests.isolation.conftest import fenced_runner, log_of
from tests.isolation.test_images import ImageJob, Reporter
from tests.oci_images import Registry, build_image, need_tools
from tests.runners import stop_runner
from workers import image_driver
from workers.isolation import remove_node_groups

SCRIPT = "nvidia-smi -L; ls /dev; ls /usr/local/nvidia/lib64; echo libs=$LD_LIBRARY_PATH"


def glibc_of(program: str) -> list[str]:
    """The shared libraries and loader `ldd` says `program` loads (absolute paths)."""
    out = subprocess.run(["ldd", program], capture_output=True, text=True, timeout=30, check=True)  # noqa: S603, S607
    return sorted(set(re.findall(r"(/\S+\.so[.0-9]*)", out.stdout)))


def test_nvidia_smi_runs_in_a_busybox_image_on_its_own_gpu(tmp_path, monkeypatch):
    gpus, why = nvml_inventory()
    if not gpus:
        pytest.skip(f"no NVIDIA GPU here ({why}): this test runs on a GPU machine")
    need_tools()
    smi = shutil.which("nvidia-smi")
    if smi is None or not image_driver.host_has_driver():
        pytest.skip("no nvidia-smi or no /proc/driver/nvidia here")
    libc = [path for path in glibc_of(smi) if "nvidia" not in path]
    dirs = ":".join(sorted({str(pathlib.PurePath(path).parent) for path in libc}))
    layout = build_image(tmp_path / "image", marker="gpu", cmd=[], host_files=libc,
                         env=["PATH=/bin", f"LD_LIBRARY_PATH={dirs}"])  # fmt: skip
    registry = Registry(tmp_path / "registry")
    runner = None
    try:
        registry.push(layout, "v1", "team/smi:v1")
        monkeypatch.setenv("GPUPLATFORM_INSECURE_REGISTRIES", registry.host)
        runner = fenced_runner(tmp_path / "agent")  # the real GPUs: no fake device files
        runner.reporter = Reporter()
        job = ImageJob(argv=["sh", "-c", SCRIPT], attempt_id=1, job_id="job-1", image=f"{registry.host}/team/smi:v1",
                       gpu_indices=[0])  # fmt: skip
        assert runner.launch(job)
        deadline, done = time.monotonic() + 120, []
        while not done and time.monotonic() < deadline:
            runner.tick()
            done = [e for e in runner.reporter.events if e[0] == "finished"]
            time.sleep(0.1)
        log = log_of(runner, (1, 0))
        print(log)
        assert done and done[0][1:3] == (0, ""), log
        listed = re.findall(r"^GPU \d+: .*\(UUID: (GPU-[0-9a-f-]+)\)", log, re.MULTILINE)
        assert listed == [gpus[0]["uuid"]], log  # its own GPU, and only that one
        assert "libnvidia-ml.so.1" in log and "nvidiactl" in log
        assert f"libs={dirs}:{image_driver.LIB_DIR}\n" in log  # the image's, then the driver's
    finally:
        if runner is not None:
            stop_runner(runner)
            remove_node_groups(runner.isolation.cgroups)
        registry.stop()
