"""Job environments built with uv on the node (workers/envs.py), from a local wheel dir this test
writes (never the network): a cold build, a reuse, a failed build's reason."""

import base64
import hashlib
import io
import os
import pathlib
import subprocess
import zipfile

import pytest

from workers import envs


def write_wheel(
    directory: pathlib.Path, name: str = "gpuplatform_tinydep", version: str = "1.0"
) -> pathlib.Path:
    """A pure-Python wheel, zipped by hand: a module saying its version."""
    files = {
        f"{name}/__init__.py": f"VERSION = {version!r}\n".encode(),
        f"{name}-{version}.dist-info/METADATA": (
            f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n"
        ).encode(),
        f"{name}-{version}.dist-info/WHEEL": (
            b"Wheel-Version: 1.0\nGenerator: hand\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
        ),
    }
    record = io.StringIO()
    for path, data in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        record.write(f"{path},sha256={digest},{len(data)}\n")
    record.write(f"{name}-{version}.dist-info/RECORD,,\n")
    files[f"{name}-{version}.dist-info/RECORD"] = record.getvalue().encode()
    directory.mkdir(parents=True, exist_ok=True)
    wheel = directory / f"{name}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as out:
        for path, data in files.items():
            out.writestr(path, data)
    return wheel


@pytest.fixture
def offline(tmp_path):
    wheels = tmp_path / "wheels"
    write_wheel(wheels)
    return envs.Settings.from_env(
        {"GPUPLATFORM_PIP_NO_INDEX": "1", "GPUPLATFORM_PIP_FIND_LINKS": str(wheels)}
    )


def test_settings_become_uv_options():
    assert envs.Settings.from_env({}).uv_args() == ["--no-build"]
    mirror = envs.Settings.from_env({"GPUPLATFORM_PIP_INDEX_URL": "https://mirror.internal/simple"})
    assert mirror.uv_args() == ["--no-build", "--index-url", "https://mirror.internal/simple"]
    offline = envs.Settings.from_env({"GPUPLATFORM_PIP_NO_INDEX": "1", "GPUPLATFORM_PIP_FIND_LINKS": "/w",
                                      "GPUPLATFORM_PIP_INDEX_URL": "https://ignored"})  # fmt: skip
    assert offline.uv_args() == ["--no-build", "--no-index", "--find-links", "/w"]


def test_requirements_are_normalised_so_one_set_is_one_environment():
    assert envs.normalise([" b==1 ", "# a comment", "", "a>=2  # why", "b==1"]) == ["a>=2", "b==1"]
    python = envs.interpreter()
    assert envs.digest_of(envs.normalise(["b==1", "a>=2"]), python) == envs.digest_of(
        envs.normalise(["a>=2", "b==1"]), python
    )


@pytest.mark.parametrize(
    ("line", "match"),
    [
        ("--index-url https://evil/simple", "is an option"),
        ("-r other.txt", "is an option"),
        ("-e .", "is an option"),
        ("/etc/passwd", "not a package requirement"),
        ("./local.whl", "not a package requirement"),
        ("pkg @ file:///root/x.whl", "only https URLs"),
    ],
)
def test_options_and_local_paths_are_refused(line, match):
    with pytest.raises(envs.EnvError, match=match):
        envs.normalise([line])


def test_a_cold_build_then_a_reuse(tmp_path, offline):
    cache = envs.EnvCache(tmp_path / "envs", offline)
    log = io.BytesIO()
    env = cache.get(envs.normalise(["gpuplatform-tinydep==1.0"]), log)
    assert not env.reused
    text = log.getvalue().decode()
    assert f"gpuplatform: building environment {env.digest[:12]}" in text
    assert "gpuplatform-tinydep==1.0" in text  # uv's own output: what it installed
    out = subprocess.run([env.python, "-c", "import gpuplatform_tinydep as t; print(t.VERSION)"],
                         capture_output=True, text=True, check=True)  # fmt: skip
    assert out.stdout.strip() == "1.0"
    # read-only: no job can change it for the next one
    assert not os.stat(env.path).st_mode & 0o222
    site = next(env.path.glob("lib/python*/site-packages/gpuplatform_tinydep"))
    assert not os.stat(site / "__init__.py").st_mode & 0o222
    # compiled when built: a job's import reads the bytecode, never compiles (nor could write it)
    assert list((site / "__pycache__").glob("__init__.cpython-*.pyc"))
    verbose = subprocess.run([env.python, "-v", "-c", "import gpuplatform_tinydep"], capture_output=True,
                             text=True, check=True, env={"PATH": "/usr/bin:/bin"})  # fmt: skip
    assert f"code object from '{site}/__pycache__/__init__.cpython-" in verbose.stderr

    again = io.BytesIO()
    reused = cache.get(envs.normalise(["gpuplatform-tinydep==1.0"]), again)
    assert reused.reused and reused.path == env.path
    assert again.getvalue().decode() == f"gpuplatform: environment {env.digest[:12]} reused\n"


def test_a_failed_build_says_why_and_leaves_nothing(tmp_path, offline):
    cache = envs.EnvCache(tmp_path / "envs", offline)
    log = io.BytesIO()
    with pytest.raises(envs.EnvError) as failure:
        cache.get(envs.normalise(["no-such-package-here==9"]), log)
    assert "no-such-package-here" in str(failure.value)
    assert "No solution found" in str(failure.value) and len(str(failure.value)) <= 240
    digest = envs.digest_of(["no-such-package-here==9"], envs.interpreter())
    assert not (tmp_path / "envs" / digest).exists()  # the next job asking tries again
    assert "no-such-package-here" in log.getvalue().decode()  # uv's words reach the job's log


def test_a_member_stopped_while_waiting_for_a_build_stops_waiting(tmp_path, offline):
    import fcntl

    cache = envs.EnvCache(tmp_path / "envs", offline)
    wanted = envs.normalise(["gpuplatform-tinydep==1.0"])
    digest = envs.digest_of(wanted, envs.interpreter())
    with open(tmp_path / "envs" / f"{digest}.lock", "a") as held:  # another member builds it
        fcntl.flock(held, fcntl.LOCK_EX)
        calls = []
        with pytest.raises(envs.Stopped):
            cache.get(wanted, io.BytesIO(), stopped=lambda: calls.append(1) or len(calls) > 2)
    assert not (tmp_path / "envs" / digest).exists()


def test_a_member_stopped_while_its_environment_builds_kills_the_build(tmp_path, offline):
    cache = envs.EnvCache(tmp_path / "envs", offline)
    wanted = envs.normalise(["gpuplatform-tinydep==1.0"])
    with pytest.raises(envs.Stopped):
        cache.get(wanted, io.BytesIO(), stopped=lambda: True)  # at its first check
    assert not (tmp_path / "envs" / envs.digest_of(wanted, envs.interpreter())).exists()
    assert not cache.get(wanted, io.BytesIO()).reused  # and the next member builds it whole
