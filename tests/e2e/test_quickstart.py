"""The README's quick start on the real platform: `gpuplatform submit --workdir
examples/tiny-train --secret ... --wait -- python train.py` packs and uploads the example, the
node fetches it, builds its Python environment (tinystats, from a wheel directory this test
builds: the agents run offline, GPUPLATFORM_PIP_NO_INDEX=1), runs it with the secret in its
environment, and the result comes back; the stored log shows the secret as ***. A second submit
of the unchanged directory uploads nothing. Then the sweep: the same project as a job array."""

import json
import os
import pathlib
import subprocess
import sys

import pytest

from gpuplatform.launch import build_example_wheels
from tests.e2e.platform import ROOT, Platform

pytestmark = pytest.mark.e2e

NODE = "qs-1"
SECRET = "tok-5f3c9e-quickstart"  # what the job prints; the stored log must say *** instead


class QuickstartPlatform(Platform):
    """Agents that build job environments offline, from the wheel directory only."""

    wheels: pathlib.Path

    def agent_environment(self, node: str) -> dict[str, str]:
        env = super().agent_environment(node)
        env.update(GPUPLATFORM_PIP_NO_INDEX="1", GPUPLATFORM_PIP_FIND_LINKS=str(self.wheels))
        return env


@pytest.fixture(scope="module")
def platform(tmp_path_factory):
    data = tmp_path_factory.mktemp("quickstart")
    platform = QuickstartPlatform(data, name="gpuplatform_e2e_quickstart", own_redis=True)
    platform.wheels = build_example_wheels(data / "wheels")
    try:
        yield platform.start({NODE: ("H100-80GB", 4, "rack=r1,zone=a")})
    finally:
        platform.stop()


def gpuplatform(platform, *args, user="bob", stdin=None, timeout=300):
    """The `gpuplatform` command as a user runs it (the installed script when there is one)."""
    script = pathlib.Path(sys.executable).parent / "gpuplatform"
    argv = [str(script)] if script.exists() else [sys.executable, "-m", "gpuplatform.cli"]
    env = dict(os.environ, GPUPLATFORM_URL=platform.url, GPUPLATFORM_TOKEN=platform.tokens[user])
    return subprocess.run([*argv, *args], cwd=ROOT, env=env, input=stdin, capture_output=True,
                          text=True, timeout=timeout)  # fmt: skip


def test_the_quick_start_runs_the_example_with_its_requirement_and_a_masked_secret(
    platform, tmp_path
):
    made = gpuplatform(
        platform, "secrets", "set", "TINY_TRAIN_TOKEN", user="alice", stdin=SECRET + "\n"
    )
    assert made.returncode == 0, made.stderr
    listed = gpuplatform(platform, "secrets", "list")
    assert "TINY_TRAIN_TOKEN" in listed.stdout and SECRET not in listed.stdout

    argv = ["submit", "--workdir", "examples/tiny-train", "--gpus", "1", "--env", "TINY_TRAIN_NOTE=hello",
            "--secret", "TINY_TRAIN_TOKEN", "--wait", "--", "python", "train.py", "--epochs", "5"]  # fmt: skip
    first = gpuplatform(platform, *argv)
    assert first.returncode == 0, first.stdout + first.stderr + platform.logs(f"agent-{NODE}")
    assert "uploading bundle" in first.stderr and "files" in first.stderr
    out = first.stdout
    assert "  | epoch 5/5" in out and "note='hello'" in out
    job_id = out.strip().splitlines()[-1].split()[0]
    assert out.strip().endswith(f"{job_id} succeeded exit=0")

    log = gpuplatform(platform, "logs", job_id).stdout
    assert "token=***" in log and SECRET not in log  # masked in the stored log
    # The requirement came from the environment the node built, not from the checkout.
    (line,) = [x for x in log.splitlines() if "tinystats 0.1.0 from" in x]
    assert "examples/packages" not in line and str(platform.agent_dir(NODE)) in line

    downloaded = gpuplatform(platform, "artifacts", job_id, "--download", str(tmp_path))
    assert downloaded.returncode == 0, downloaded.stderr
    result = json.loads((tmp_path / "result.json").read_text())
    assert result["epochs"] == 5 and 2.0 < result["slope"] < 4.0

    # The same directory again: nothing to upload, and the job runs from the node's caches.
    second = gpuplatform(platform, *argv)
    assert second.returncode == 0, second.stdout + second.stderr
    assert "already uploaded" in second.stderr and "uploading bundle" not in second.stderr
    assert first.stderr.split(":")[0] == second.stderr.split(":")[0]  # "bundle <sha12>"


def test_a_bundle_with_a_link_out_is_refused_before_upload_and_bad_fields_name_themselves(
    platform, tmp_path
):
    project = tmp_path / "proj"
    project.mkdir()
    (project / "train.py").write_text("print(1)\n")
    os.symlink("/etc/passwd", project / "passwd")
    refused = gpuplatform(platform, "submit", "--workdir", str(project), "--", "python", "train.py")
    assert refused.returncode == 2 and "passwd" in refused.stderr and "outside" in refused.stderr

    os.unlink(project / "passwd")
    bad = gpuplatform(platform, "submit", "--workdir", str(project), "--env", "CUDA_VISIBLE_DEVICES=0",
                      "--secret", "NO_SUCH_SECRET", "--", "python", "train.py")  # fmt: skip
    assert bad.returncode == 3 and "400" in bad.stderr
    assert "env" in bad.stderr and "secrets" in bad.stderr


def test_the_sweep_runs_the_example_as_an_array(platform, tmp_path):
    swept = gpuplatform(platform, "submit", "--workdir", "examples/tiny-train", "--gpus", "1",
                        "--array", "0-3%2", "--wait", "--", "python", "train.py", "--sweep", "sweep.json",
                        "--epochs", "3")  # fmt: skip
    assert swept.returncode == 0, swept.stdout + swept.stderr
    lines = swept.stdout.strip().splitlines()
    array_id = lines[0].split()[0]
    assert "/4 done %2" in lines[0] and "4/4 done" in lines[-1] and "(4 succeeded)" in lines[-1]
    assert "bundle " in swept.stderr

    shown = gpuplatform(platform, "show", array_id).stdout
    assert "4/4 done" in shown and "succeeded  4" in shown
    tasks = gpuplatform(platform, "--json", "list", "--array", array_id)
    results = {}
    for task in json.loads(tasks.stdout)["results"]:
        got = gpuplatform(
            platform, "artifacts", task["id"], "--download", str(tmp_path / task["id"])
        )
        assert got.returncode == 0, got.stderr
        results[task["array_index"]] = json.loads(
            (tmp_path / task["id"] / "result.json").read_text()
        )
    sweep = json.loads((ROOT / "examples" / "tiny-train" / "sweep.json").read_text())
    assert {i: r["lr"] for i, r in results.items()} == {i: sweep[i]["lr"] for i in range(4)}
