"""The command-line client round-trips a job against a running platform: submit, list, show,
wait (following the event stream), logs, artifacts; cancel; config from the environment or
a config file. It runs as its own process, as a user would run it."""

import json
import os
import subprocess
import sys

import pytest

from tests.e2e.platform import ROOT

pytestmark = pytest.mark.e2e


def cli(platform, *args, user="bob", env=None, timeout=120):
    env = dict(
        os.environ,
        GPUPLATFORM_URL=platform.url,
        GPUPLATFORM_TOKEN=platform.tokens[user],
        **(env or {}),
    )
    return subprocess.run([sys.executable, "-m", "gpuplatform.cli", *args], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=timeout)  # fmt: skip


def test_the_cli_round_trips_a_job(platform, tmp_path):
    submitted = cli(platform, "--json", "submit", "-t", "demo-train", "-p", "steps=4", "-p", "step_seconds=0.2",
                    "--gpus", "1", "--sku", "H100-80GB", "--name", "cli-run")  # fmt: skip
    assert submitted.returncode == 0, submitted.stderr
    job_id = json.loads(submitted.stdout)["id"]

    assert job_id in cli(platform, "list").stdout
    waited = cli(platform, "wait", job_id)
    assert waited.returncode == 0, waited.stdout + waited.stderr
    out = waited.stdout
    # Every state in order, the job's own output, and the final word.
    assert (
        out.index("] queued")
        < out.index("] starting")
        < out.index("] running")
        < out.index("] succeeded")
    )
    assert "| step 4/4" in out and out.strip().endswith(f"{job_id} succeeded exit=0")

    shown = cli(platform, "show", job_id).stdout
    assert "state succeeded" in shown and "ui-h1" in shown
    assert "step 4/4" in cli(platform, "logs", job_id).stdout
    assert "result.json" in cli(platform, "artifacts", job_id).stdout
    downloaded = cli(platform, "artifacts", job_id, "--download", str(tmp_path))
    assert downloaded.returncode == 0, downloaded.stderr
    assert json.loads((tmp_path / "result.json").read_text())["steps"] == 4


def test_the_cli_cancels_and_wait_reports_it(platform):
    job_id = json.loads(cli(platform, "--json", "submit", "-t", "demo-train", "-p", "steps=200",
                            "-p", "step_seconds=0.2", "--gpus", "1").stdout)["id"]  # fmt: skip
    assert cli(platform, "cancel", job_id).stdout.strip() == f"{job_id} cancelled"
    waited = cli(platform, "wait", job_id, "--quiet")
    assert waited.returncode == 1 and waited.stdout.strip().startswith(f"{job_id} cancelled")


def test_the_cli_reads_a_config_file_and_reports_refusals(platform, tmp_path):
    config = tmp_path / "config.ini"
    config.write_text(f"[default]\nurl = {platform.url}\ntoken = {platform.tokens['dave']}\n")
    env = {"GPUPLATFORM_CONFIG": str(config)}
    base = dict(os.environ, **env)
    base.pop("GPUPLATFORM_URL", None)
    base.pop("GPUPLATFORM_TOKEN", None)
    listed = subprocess.run([sys.executable, "-m", "gpuplatform.cli", "list"], cwd=ROOT, env=base,
                            capture_output=True, text=True, timeout=60)  # fmt: skip
    assert listed.returncode == 0, listed.stderr
    bad = subprocess.run([sys.executable, "-m", "gpuplatform.cli", "submit", "-t", "demo-train", "-p", "steps=0"],
                         cwd=ROOT, env=base, capture_output=True, text=True, timeout=60)  # fmt: skip
    assert bad.returncode == 3 and "400" in bad.stderr and "steps" in bad.stderr
    unknown = subprocess.run([sys.executable, "-m", "gpuplatform.cli", "show", "00000000-0000-0000-0000-000000000000"],
                             cwd=ROOT, env=base, capture_output=True, text=True, timeout=60)  # fmt: skip
    assert unknown.returncode == 3 and "404" in unknown.stderr
