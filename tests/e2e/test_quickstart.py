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


NEEDS_NODE_SIDE = ("the node side of issue 17 (bundle fetch and unpack, environments with uv, secrets "
                   "and log masking: h/nodecode) is not merged into this branch yet")  # fmt: skip
NEEDS_SECRETS_CHECK = ("submit's check of secret names against the tenant's secrets "
                       "(apps/admission/submit.py check_secrets, a stub on h/bundles) is not wired yet")  # fmt: skip


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
    assert "token=***" in log and SECRET not in log, log  # masked in the stored log
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
    sha12 = first.stderr.split(":")[0].split()[1]
    assert second.stderr.split(":")[0] == f"bundle {sha12}"
    assert f"bundle {sha12} fetched" in log and "building environment" in log
    again = gpuplatform(platform, "logs", second.stdout.strip().splitlines()[-1].split()[0]).stdout
    assert f"bundle {sha12} cached" in again and "reused" in again and "building" not in again


def test_a_bundle_with_a_link_out_is_refused_before_upload_and_bad_env_names_itself(
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
                      "--", "python", "train.py")  # fmt: skip
    assert bad.returncode == 3 and "400" in bad.stderr
    assert "gpuplatform:   env: " in bad.stderr and "CUDA_VISIBLE_DEVICES" in bad.stderr


def test_an_unknown_secret_is_a_400_naming_secrets(platform):
    bad = gpuplatform(platform, "submit", "--secret", "NO_SUCH_SECRET", "--gpus", "1", "--", "true")
    assert bad.returncode == 3 and "400" in bad.stderr and "gpuplatform:   secrets: " in bad.stderr


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


def test_the_cli_speaks_the_secrets_endpoints_and_never_shows_a_value(platform):
    made = gpuplatform(platform, "secrets", "set", "QS_KEY", user="alice", stdin="v1")
    replaced = gpuplatform(platform, "secrets", "set", "QS_KEY", user="alice", stdin="v2")
    assert made.returncode == replaced.returncode == 0, made.stderr + replaced.stderr
    listed = gpuplatform(platform, "--json", "secrets", "list", user="carol")  # a viewer: names
    names = [s["name"] for s in json.loads(listed.stdout)]
    assert "QS_KEY" in names and "v2" not in listed.stdout
    member = gpuplatform(platform, "secrets", "set", "QS_KEY", user="bob", stdin="mine")
    assert member.returncode == 3 and "403" in member.stderr
    assert "QS_KEY" not in gpuplatform(platform, "secrets", "list", user="dave").stdout  # globex
    assert gpuplatform(platform, "secrets", "delete", "QS_KEY", user="alice").returncode == 0
    assert "QS_KEY" not in gpuplatform(platform, "secrets", "list").stdout


def test_the_cli_uploads_a_new_digest_once_per_tenant_and_reports_the_cap(platform, tmp_path):
    from gpuplatform.client import Client

    project = tmp_path / "proj"
    (project / ".git").mkdir(parents=True)
    (project / ".git" / "pack").write_bytes(os.urandom(3 << 20))  # left out: never uploaded
    (project / "train.py").write_text("print('own code')\n")
    argv = ["--json", "submit", "--workdir", str(project), "--", "python", "train.py"]
    first = gpuplatform(
        platform, *argv, user="dave"
    )  # globex may not run bare commands: a bundle's it may
    assert first.returncode == 0, first.stderr
    assert "uploading bundle" in first.stderr and "1 files" in first.stderr
    sha = first.stderr.split()[1].rstrip(":")
    job = json.loads(first.stdout)
    assert job["bundle"].startswith(sha) and job["command"] == ["python", "train.py"]
    again = gpuplatform(platform, *argv, user="dave")
    assert f"bundle {sha} already uploaded" in again.stderr and "uploading" not in again.stderr
    # Per tenant: acme has not uploaded it, and cannot see globex's.
    assert not Client(platform.url, platform.tokens["bob"]).bundle_exists(job["bundle"])
    assert Client(platform.url, platform.tokens["dave"]).bundle_exists(job["bundle"])

    platform.manage("shell", "-c", "from apps.tenants.models import Tenant; "
                    "Tenant.objects.filter(slug='hobby').update(bundle_max_mib=1)")  # fmt: skip
    (project / "weights.bin").write_bytes(os.urandom(2 << 20))
    refused = gpuplatform(
        platform, "submit", "--workdir", str(project), "--", "python", "train.py", user="erin"
    )
    assert refused.returncode == 3, refused.stderr
    assert "413" in refused.stderr and "1 MiB" in refused.stderr and ".gpuignore" in refused.stderr


def test_the_cli_submits_follows_shows_lists_and_cancels_an_array(platform):
    done = gpuplatform(platform, "submit", "-t", "demo-train", "-p", "steps=2", "-p", "step_seconds=0.1",
                       "--gpus", "1", "--array", "0-3%2", "--wait")  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    lines = done.stdout.strip().splitlines()
    array_id = lines[0].split()[0]
    assert "done %2" in lines[0] and lines[-1].startswith(f"{array_id}  array      4/4 done")
    shown = gpuplatform(platform, "show", array_id).stdout
    assert "succeeded  4" in shown
    tasks = json.loads(gpuplatform(platform, "--json", "list", "--array", array_id).stdout)[
        "results"
    ]
    assert sorted(t["array_index"] for t in tasks) == [0, 1, 2, 3]
    listed = gpuplatform(platform, "list").stdout.splitlines()
    assert sum(line.startswith(array_id) for line in listed) == 1  # one row for the whole array
    assert not any(line.startswith(tasks[0]["id"]) for line in listed)

    long = json.loads(gpuplatform(platform, "--json", "submit", "-t", "demo-train", "-p", "steps=200",
                                  "-p", "step_seconds=0.2", "--gpus", "1", "--array", "0-9%2").stdout)  # fmt: skip
    cancelled = gpuplatform(platform, "cancel", long["id"])
    assert cancelled.returncode == 0 and f"{long['id']} cancelled" in cancelled.stdout
    platform.wait_until(
        lambda: platform.get("bob", f"/api/v1/arrays/{long['id']}/").json()["counts"].get("cancelled") == 10,
        timeout=60, what="every task of the array cancelled",
    )  # fmt: skip


def test_a_grid_sweep_gives_each_task_its_params(platform, tmp_path):
    """`--array-grid grid.json` (3 learning rates x 2 epoch counts): each task's params reach
    train.py through the job SDK's params() and override its defaults."""
    grid = json.loads((ROOT / "examples" / "tiny-train" / "grid.json").read_text())
    swept = gpuplatform(platform, "--json", "submit", "--workdir", "examples/tiny-train", "--gpus", "1",
                        "--array", "0-5%3", "--array-grid", "examples/tiny-train/grid.json", "--wait", "--",
                        "python", "train.py", "--epoch-seconds", "0")  # fmt: skip
    assert swept.returncode == 0, swept.stdout + swept.stderr
    array_id = json.loads(swept.stdout[: swept.stdout.index("\n}\n") + 2])["id"]
    tasks = json.loads(gpuplatform(platform, "--json", "list", "--array", array_id).stdout)[
        "results"
    ]
    seen = set()
    for task in tasks:
        got = gpuplatform(
            platform, "artifacts", task["id"], "--download", str(tmp_path / task["id"])
        )
        assert got.returncode == 0, got.stderr
        result = json.loads((tmp_path / task["id"] / "result.json").read_text())
        seen.add((result["lr"], result["epochs"]))
    assert seen == {(lr, epochs) for lr in grid["lr"] for epochs in grid["epochs"]}
