"""The client is its own package: `pip install ./client` into a fresh virtual environment, with
no Django (nor anything else of the server) in it, gives a working `gpuplatform` command that
packs a directory. pip installs from whatever index it is configured with (here: the mirror)."""

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
