"""A fenced job's cgroup holds it to its memory and process limits; its log and output dir to
their caps (over one, it is stopped and the reason says which)."""

import pytest

from tests.isolation.conftest import fenced_runner, finish, launch, report, result_of


def test_a_job_over_its_memory_limit_is_killed_by_its_cgroup(runner):
    code = "blocks = []\nwhile True:\n    blocks.append(bytearray(16 * 2**20))\n"
    key = launch(runner, code, memory_mib=64)
    exit_code, reason = finish(runner, key)[1:]
    assert (
        exit_code == -9 and reason == "killed by signal 9"
    )  # the OOM killer, inside its own group
    assert runner.isolation.cgroups is not None


def test_a_job_cannot_start_more_processes_than_its_pids_limit(runner):
    code = report(
        "import subprocess\nstarted = []\n"
        "for _ in range(40):\n"
        "    try:\n        started.append(subprocess.Popen(['sleep', '30']))\n"
        "    except OSError:\n        break\n"
        "result['started'] = len(started)\n"
        "for p in started:\n    p.kill()\n"
    )
    key = launch(runner, code, pids_max=10)
    assert finish(runner, key)[1] == 0
    assert result_of(runner, key)["started"] < 10  # itself and its threads count too


@pytest.fixture
def capped(tmp_path, monkeypatch):
    monkeypatch.setenv("GPUPLATFORM_MAX_LOG_BYTES", "10000")
    monkeypatch.setenv("GPUPLATFORM_MAX_OUTPUT_BYTES", "50000")
    return fenced_runner(tmp_path / "agent")


def test_a_job_that_writes_past_the_log_cap_is_stopped_with_that_reason(capped):
    key = launch(
        capped,
        "import time\nwhile True:\n    print('x' * 1000, flush=True)\n    time.sleep(0.001)\n",
    )
    assert finish(capped, key)[2] == "log over 10000 bytes"
    assert (
        capped.data_dir / "logs" / "job-1" / "attempt-1-rank-0.log"
    ).stat().st_size < 10000 + 200


def test_a_job_whose_output_passes_the_cap_is_stopped_with_that_reason(capped):
    code = "import time\nfrom gpuplatform_job import output_dir\n(output_dir() / 'big').write_bytes(b'x' * 60000)\ntime.sleep(60)\n"
    key = launch(capped, code)
    assert finish(capped, key)[2] == "output over 50000 bytes"
