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


def cgroup_limits(run) -> dict:
    """The member's limits as its cgroup holds them (v2, or the v1 groups of a hybrid host)."""
    group = run.cgroup
    if group.v2 is not None and (group.v2 / "memory.max").exists():
        read = {
            name: (group.v2 / name).read_text().strip()
            for name in ("memory.max", "pids.max", "cpu.weight")
        }
        return {
            "memory": int(read["memory.max"]),
            "pids": int(read["pids.max"]),
            "cpu": int(read["cpu.weight"]),
        }
    return {
        "memory": int((group.v1["memory"] / "memory.limit_in_bytes").read_text()),
        "pids": int((group.v1["pids"] / "pids.max").read_text()),
        "cpu_shares": int((group.v1["cpu"] / "cpu.shares").read_text()),
    }


@pytest.mark.django_db
def test_a_job_gets_the_limits_it_asked_for_else_its_templates_in_its_cgroup(runner):
    """Submitted through the API, placed, fetched through the agent API like an agent does: the
    memory and CPU weight the body asks for, the template's process limit, in the member's cgroup."""
    from apps.jobs.models import JobTemplate
    from apps.nodes.credentials import issue_credential
    from apps.scheduling.dispatcher import dispatch_once
    from tests.agent_http import agent_api
    from tests.factories import client_for, make_cast, make_node

    cast = make_cast()
    make_node("h1", gpus=1)
    JobTemplate.objects.create(name="limited", argv=["{python}", "-c", "import time; time.sleep(60)"],
                               pids_max=77, memory_mib=4096)  # fmt: skip
    body = {
        "template": "limited",
        "gpus": 1,
        "gpu_sku": "H100-80GB",
        "memory_mib": 96,
        "cpu_weight": 300,
    }
    answer = client_for(cast["bob"][1]).post("/api/v1/jobs/", body, format="json")
    assert answer.status_code == 201, answer.content
    dispatch_once()
    ((key, assignment),) = agent_api(issue_credential(node_name="h1")[1]).assignments().items()
    assert (assignment.memory_mib, assignment.pids_max, assignment.cpu_weight) == (96, 77, 300)
    assert runner.launch(assignment)
    limits = cgroup_limits(runner.runs[key])
    assert limits["memory"] == 96 * 2**20 and limits["pids"] == 77
    assert limits.get("cpu", 0) == 300 or limits.get("cpu_shares", 0) == 300 * 1024 // 100
