"""The client's first hour (issue 31) against a live platform, as a user runs it: templates and
free GPUs, ids shortened to 8 characters everywhere, the list's columns, the last log lines
before the final state, an array's results, Ctrl-C during `submit --wait`, and an empty log of
a job that waits."""

import json
import os
import signal
import subprocess
import sys

import pytest

from tests.cli.test_cli import cli
from tests.e2e.platform import ROOT

pytestmark = pytest.mark.e2e

TRAIN = ["-t", "demo-train", "-p", "step_seconds=0.1", "--gpus", "1", "--sku", "H100-80GB"]


def submitted_id(platform, *args) -> str:
    answer = cli(platform, "--json", "submit", *args)
    assert answer.returncode == 0, answer.stderr
    return json.loads(answer.stdout)["id"]


def test_templates_and_free_gpus_per_sku(platform):
    templates = cli(platform, "templates")
    assert templates.returncode == 0, templates.stderr
    assert "demo-train" in templates.stdout and "steps=10 (integer 1..100000)" in templates.stdout
    nodes = cli(platform, "nodes")
    assert nodes.returncode == 0, nodes.stderr
    rows = {line.split()[0]: line.split()[1:3] for line in nodes.stdout.splitlines()[1:]}
    assert rows["A100-40GB"] == ["2", "4"] and rows["H100-80GB"] == ["1", "4"]


def test_a_short_id_works_everywhere_and_the_last_lines_come_first(platform, tmp_path):
    job_id = submitted_id(platform, *TRAIN, "-p", "steps=3", "--name", "short-ids")
    short = job_id[:8]
    waited = cli(platform, "wait", short)
    assert waited.returncode == 0, waited.stdout + waited.stderr
    out = waited.stdout
    assert out.index("| step 3/3") < out.index("] succeeded") < out.index(f"{job_id} succeeded")

    shown = cli(platform, "show", short).stdout
    assert (
        shown.startswith(f"{job_id}  short-ids") and "duration " in shown and "node ui-h1" in shown
    )
    assert "step 3/3" in cli(platform, "logs", short).stdout
    assert "result.json" in cli(platform, "artifacts", short).stdout
    assert cli(platform, "artifacts", short, "--download", str(tmp_path)).returncode == 0
    assert (tmp_path / "result.json").exists()

    listed = cli(platform, "list").stdout.splitlines()
    assert listed[0].split() == ["ID", "STATE", "PROG", "TIER", "GPUS", "SUBMITTED", "STARTED",
                                 "DURATION", "NODE", "NAME"]  # fmt: skip
    (row,) = [line for line in listed if line.startswith(job_id)]
    assert row.split()[1:5] == ["succeeded", "100%", "enterprise", "1"]
    assert row.split()[-2:] == ["ui-h1", "short-ids"]

    again = cli(platform, "cancel", short)
    assert again.returncode == 3
    assert again.stderr.count("job already succeeded") == 1 and "{" not in again.stderr
    assert cli(platform, "show", job_id[:7]).returncode == 3  # under 8 characters: not an id


def test_an_arrays_artifacts_are_each_tasks_results(platform):
    array_id = submitted_id(platform, *TRAIN, "-p", "steps=1", "--array", "0-1")
    assert cli(platform, "wait", array_id[:8]).returncode == 0
    listed = cli(platform, "artifacts", array_id[:8])
    assert listed.returncode == 0, listed.stderr
    lines = listed.stdout.splitlines()
    assert [line.split()[0] for line in lines if line.startswith("[")] == ["[0]", "[1]"]
    assert sum("result.json" in line for line in lines) == 2


def test_ctrl_c_while_waiting_leaves_the_job_running_and_says_how_to_follow_it(platform):
    env = dict(os.environ, GPUPLATFORM_URL=platform.url, GPUPLATFORM_TOKEN=platform.tokens["bob"])
    process = subprocess.Popen(
        [sys.executable, "-m", "gpuplatform.cli", "submit", *TRAIN, "-p", "steps=300", "--wait"],
        cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    first = process.stdout.readline()  # "<id> queued demo-train"
    job_id = first.split()[0]
    while "] running" not in process.stdout.readline():
        pass
    process.send_signal(signal.SIGINT)
    _, err = process.communicate(timeout=60)
    assert process.returncode == 130, err
    assert "the job goes on" in err and f"gpuplatform wait {job_id}" in err
    assert "Traceback" not in err
    assert "state running" in cli(platform, "show", job_id).stdout

    # A job held behind it has no output yet, and `logs` says why.
    held = submitted_id(platform, *TRAIN, "-p", "steps=1", "--depends-on", job_id[:8])
    logs = cli(platform, "logs", held[:8])
    assert logs.returncode == 0 and logs.stdout == ""
    assert f"job {held} is queued (waiting for dependency {job_id}" in logs.stderr
    assert "no output yet" in logs.stderr
    assert cli(platform, "cancel", job_id[:8]).stdout.strip() == f"{job_id} cancelled"
