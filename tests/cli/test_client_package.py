"""The client is its own package: `pip install ./client` into a fresh virtual environment, with
no Django (nor anything else of the server) in it, gives a working `gpuplatform` command that
packs a directory. pip installs from whatever index it is configured with (here: the mirror)."""

import json
import shutil
import subprocess
import sys

import pytest

from gpuplatform import _client_path  # noqa: F401
from gpuplatform_client import pack
from tests.e2e.platform import ROOT

pytestmark = pytest.mark.slow  # a venv and an install: ~20 s


def test_the_client_installs_alone_and_runs(tmp_path):
    source = tmp_path / "client"
    shutil.copytree(
        ROOT / "client", source, ignore=shutil.ignore_patterns("build", "*.egg-info", "__pycache__")
    )
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    pip = subprocess.run([str(venv / "bin" / "pip"), "install", "-q", str(source)],
                         capture_output=True, text=True, timeout=600)  # fmt: skip
    assert pip.returncode == 0, pip.stdout + pip.stderr
    python = str(venv / "bin" / "python")
    installed = subprocess.run([python, "-m", "pip", "list", "--format=freeze"], capture_output=True,
                               text=True, check=True).stdout.lower()  # fmt: skip
    names = {line.split("==")[0] for line in installed.split()}
    assert "gpuplatform-client" in names and "pathspec" in names
    assert not {"django", "djangorestframework", "celery", "redis"} & names

    helped = subprocess.run(
        [str(venv / "bin" / "gpuplatform"), "--help"], capture_output=True, text=True, timeout=60
    )
    assert helped.returncode == 0 and "submit" in helped.stdout and "secrets" in helped.stdout
    submit_help = subprocess.run(
        [str(venv / "bin" / "gpuplatform"), "submit", "--help"], capture_output=True, text=True
    )
    assert "--workdir" in submit_help.stdout and "--array" in submit_help.stdout

    # The SDK packs the example project the same way as the repo's checkout does.
    script = ("import sys; from gpuplatform_client import pack; "
              "b = pack.pack(sys.argv[1]); print(b.sha256); b.path.unlink()")  # fmt: skip
    packed = subprocess.run([python, "-c", script, str(ROOT / "examples" / "tiny-train")],
                            capture_output=True, text=True, check=True, cwd=tmp_path)  # fmt: skip
    bundle = pack.pack(ROOT / "examples" / "tiny-train")
    bundle.path.unlink()
    assert packed.stdout.strip() == bundle.sha256
    no_django = subprocess.run([python, "-c", "import django"], capture_output=True)
    assert no_django.returncode != 0


def test_make_run_builds_the_example_wheel_and_the_example_runs_on_a_laptop(tmp_path):
    """`make run` (gpuplatform/launch.py) builds examples/packages/ into a wheel directory and
    hands it to every Procfile agent; the example trains anywhere its requirement is installed."""
    from gpuplatform.launch import build_example_wheels, procfile_agents

    wheels = build_example_wheels(tmp_path / "wheels")
    assert [w.name for w in wheels.iterdir()] == ["gpuplatform_tinystats-0.1.0-py3-none-any.whl"]
    assert build_example_wheels(wheels) == wheels  # built once per version
    assert not list((ROOT / "examples" / "packages" / "gpuplatform-tinystats").glob("*.egg-info"))
    agent_lines = [
        line for line in (ROOT / "Procfile").read_text().splitlines() if line.startswith("agent-")
    ]
    assert len(agent_lines) == len(procfile_agents()) > 0
    for name in (
        "GPUPLATFORM_PIP_FIND_LINKS",
        "GPUPLATFORM_PIP_INDEX_URL",
        "GPUPLATFORM_PIP_NO_INDEX",
    ):
        assert all(f'${{{name}:+{name}="${name}"}}' in line for line in agent_lines), name
    # What the shell makes of an agent's line: a setting passed when set, nothing when not.
    prefix = (
        agent_lines[0].split(":", 1)[1].split(" python -m ")[0].replace("exec env -i", "env -i")
    )
    seen = subprocess.run(["sh", "-c", prefix + " env"], env={"PATH": "/usr/bin:/bin", "GPUPLATFORM_PIP_FIND_LINKS": "/w d"},
                          capture_output=True, text=True, check=True).stdout.splitlines()  # fmt: skip
    assert "GPUPLATFORM_PIP_FIND_LINKS=/w d" in seen
    assert not [
        line for line in seen if line.startswith(("GPUPLATFORM_PIP_NO_INDEX", "SSL_CERT_FILE"))
    ]

    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    subprocess.run([str(venv / "bin" / "pip"), "install", "-q", "--no-index", "--find-links", str(wheels),
                    "gpuplatform-tinystats"], check=True, timeout=300)  # fmt: skip
    work = tmp_path / "laptop"
    shutil.copytree(ROOT / "examples" / "tiny-train", work)
    env = {"PATH": "/usr/bin:/bin", "TINY_TRAIN_TOKEN": "local", "GPUPLATFORM_ARRAY_INDEX": "2"}
    ran = subprocess.run([str(venv / "bin" / "python"), "train.py", "--epochs", "40", "--epoch-seconds", "0",
                          "--sweep", "sweep.json"], cwd=work, env=env, capture_output=True, text=True, timeout=120)  # fmt: skip
    assert ran.returncode == 0, ran.stderr
    assert "tinystats 0.1.0 from" in ran.stdout and "token=local" in ran.stdout
    result = json.loads((work / "output" / "result.json").read_text())
    assert result["lr"] == 0.03 and result["array_index"] == 2 and result["epochs"] == 40
    # A second run resumes from the checkpoint the first left.
    again = subprocess.run([str(venv / "bin" / "python"), "train.py", "--epochs", "45", "--epoch-seconds", "0"],
                           cwd=work, env=env, capture_output=True, text=True, timeout=120)  # fmt: skip
    assert "resuming from the checkpoint of epoch 40" in again.stdout
    assert json.loads((work / "output" / "result.json").read_text())["resumed_from_epoch"] == 40
