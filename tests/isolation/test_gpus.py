"""Only the job's own GPUs: with `--fake` the agent makes device files for every GPU, and a
fenced job sees only its own (the rest are not in its mount namespace, and denied in the v1
devices cgroup where there is one)."""

import os
import shutil
import subprocess
import sys
import uuid

import pytest

from tests.isolation.conftest import finish, launch, outside_private_tmp, report, result_of
from workers.isolation import make_fake_devices
from workers.runner import Runner


def test_a_job_sees_only_its_own_fake_gpu_device_files(runner):
    assert sorted(os.listdir(runner.device_dir)) == ["nvidia0", "nvidia1", "nvidia2", "nvidia3"]
    code = report(
        "d = os.environ['GPUPLATFORM_DEVICE_DIR']\n"
        "result['listed'] = sorted(os.listdir(d))\n"
        "result['others'] = [os.path.exists(os.path.join(d, f'nvidia{i}')) for i in (0, 3)]\n"
        "result['cvd'] = os.environ['CUDA_VISIBLE_DEVICES']\n"
    )
    key = launch(runner, code, gpu_indices=[1, 2])
    assert finish(runner, key)[1] == 0
    assert result_of(runner, key) == {
        "listed": ["nvidia1", "nvidia2"],
        "others": [False, False],
        "cvd": "1,2",
    }


PROBE = """
import errno, os, sys
open(sys.argv[1], "w").write(str(os.getpid()))  # into the job's devices cgroup
for path in sys.argv[2:]:
    try:
        os.close(os.open(path, os.O_RDONLY))
        print("opened")
    except OSError as error:
        print(errno.errorcode[error.errno])
"""


def test_other_gpus_are_denied_in_the_devices_cgroup_on_a_hybrid_host(runner):
    """Even a root process in the job's devices cgroup cannot open another GPU's device file;
    its own answers ENXIO (a fake device: no driver behind it), not EPERM."""
    key = launch(runner, "import time; time.sleep(60)", gpu_indices=[1])
    group = runner.runs[key].cgroup
    if "devices" not in group.v1 or not (runner.device_dir / "nvidia0").is_char_device():
        pytest.skip(
            "no v1 devices controller here, or mknod was refused (the fake GPUs are plain files)"
        )
    probe = subprocess.run([sys.executable, "-c", PROBE, str(group.v1["devices"] / "cgroup.procs"),
                            str(runner.device_dir / "nvidia0"), str(runner.device_dir / "nvidia1")],
                           capture_output=True, text=True, check=True)  # fmt: skip
    assert probe.stdout.split() == ["EPERM", "ENXIO"]
    runner.stop(*key, "cancel")
    finish(runner, key)


def test_with_real_gpus_the_other_device_files_are_covered_and_cuda_counts_from_zero(
    runner, request, monkeypatch
):
    """As on a node with /dev/nvidiaN: a world-traversable dir of char devices, shared with the
    host. The job's namespace covers the other GPUs' files with an empty root-only file."""
    dev = outside_private_tmp() / f".isolation-test-dev-{uuid.uuid4().hex[:8]}"
    request.addfinalizer(lambda: shutil.rmtree(dev))
    make_fake_devices(dev, 3)
    dev.chmod(0o755)
    if not (dev / "nvidia0").is_char_device():
        pytest.skip("mknod was refused here: no char device files to cover")
    monkeypatch.setattr(runner, "device_dir", dev)
    monkeypatch.setattr(Runner, "fake_devices", property(lambda self: False))
    code = report(
        "import errno\n"
        "for i in range(3):\n"
        "    try:\n"
        f"        os.close(os.open('{dev}/nvidia%d' % i, os.O_RDONLY))\n"
        "        result[str(i)] = 'opened'\n"
        "    except OSError as error:\n"
        "        result[str(i)] = errno.errorcode[error.errno]\n"
        "result['cvd'] = os.environ['CUDA_VISIBLE_DEVICES']\n"
        "result['indices'] = os.environ['GPUPLATFORM_GPU_INDICES']\n"
    )
    key = launch(runner, code, gpu_indices=[1])
    finished = finish(runner, key)
    assert finished[1:] == (0, ""), finished[2]
    assert result_of(runner, key) == {
        "0": "EACCES",
        "1": "ENXIO",
        "2": "EACCES",
        "cvd": "0",
        "indices": "1",
    }
