"""The runner with own code (workers/prepare.py): a job runs in its unpacked bundle with its env
vars and secrets, the secrets masked in its log; a refused bundle or a deleted secret ends it
`failed`, not retried, with a reason naming the member. Real subprocesses, fenced where this
test runs as root with cgroups; the agent API is a recording reporter."""

import hashlib
import io
import tarfile
from dataclasses import dataclass, field

import pytest

from tests.unit.test_runner import Recorder, run_until_finished
from workers.agent_client import ApiError
from workers.isolation import detect, unfenced
from workers.runner import Runner


@dataclass
class Work:
    argv: list
    bundle: str = ""
    env: dict = field(default_factory=dict)
    secrets: list = field(default_factory=list)
    python_requirements: list = field(default_factory=list)
    job_id: str = "job-1"
    attempt_id: int = 1
    attempt_number: int = 1
    rank: int = 0
    token: str = "t"
    params: dict = field(default_factory=dict)
    gpu_indices: list = field(default_factory=lambda: [0])
    world_size: int = 1
    master_addr: str = "127.0.0.1"
    master_port: int = 29501
    max_runtime_seconds: int = 60
    checkpoint: str = ""
    stop_requested: str = ""
    active: bool = True
    grace_seconds: int = 5
    checkpoint_signal: str = "SIGUSR1"


class OwnCode(Recorder):
    def __init__(self, archive: bytes = b"", secrets=None, secrets_error=None):
        super().__init__()
        self.archive, self.secret_values, self.secrets_error = archive, secrets or {}, secrets_error
        self.fetches = 0

    def started(self, run):
        self.events.append(("started", run.process.pid if run.process else 0))

    def bundle_chunks(self, run):
        self.fetches += 1
        yield self.archive

    def secrets(self, run):
        if self.secrets_error:
            raise self.secrets_error
        return self.secret_values


def tar_gz(files: dict[str, bytes]) -> tuple[bytes, str]:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size, info.mode = len(data), 0o644
            tar.addfile(info, io.BytesIO(data))
    data = buffer.getvalue()
    return data, hashlib.sha256(data).hexdigest()


SCRIPT = b"""import os, pathlib
print("cwd", os.getcwd() == os.environ["HOME"], pathlib.Path("data.txt").read_text().strip())
print("token", os.environ["HF_TOKEN"])
print("mine", os.environ["MY_SETTING"], "rank", os.environ["RANK"])
"""


@pytest.fixture(params=["unfenced", "fenced"])
def make_runner(request, tmp_path):
    def make(reporter):
        if request.param == "unfenced":
            return Runner(node="n1", data_dir=tmp_path, reporter=reporter, kill_grace=1.0,
                          isolation=unfenced("unit test of the unfenced path"))  # fmt: skip
        fenced = detect("n1")
        if not fenced.jailed:
            pytest.skip(f"cannot fence jobs here: {fenced.reason}")
        return Runner(node="n1", data_dir=tmp_path, reporter=reporter, kill_grace=1.0,
                      isolation=fenced)  # fmt: skip

    return make


def test_a_job_runs_in_its_bundle_with_its_env_and_masked_secrets(make_runner):
    archive, digest = tar_gz({"train.py": SCRIPT, "data.txt": b"hello\n"})
    reporter = OwnCode(archive, secrets={"HF_TOKEN": "hf_s3cr3t_value"})
    runner = make_runner(reporter)
    work = Work(argv=["{python}", "train.py"], bundle=digest, secrets=["HF_TOKEN"],
                env={"MY_SETTING": "42", "RANK": "99"})  # fmt: skip
    runner.launch(work)
    assert run_until_finished(runner) == ("finished", 0, "")
    log = next((runner.data_dir / "logs" / "job-1").glob("*.log")).read_text()
    assert f"gpuplatform: bundle {digest[:12]} fetched ({len(archive)} bytes)" in log
    assert "cwd True hello" in log  # it ran in the unpacked bundle
    assert "token ***" in log and "hf_s3cr3t_value" not in log
    assert "mine 42 rank 0" in log  # the platform's RANK wins over the job's own

    runner.launch(Work(argv=["{python}", "train.py"], bundle=digest, secrets=["HF_TOKEN"],
                       env={"MY_SETTING": "1"}, attempt_id=2, attempt_number=2))  # fmt: skip
    reporter.events.clear()
    assert run_until_finished(runner) == ("finished", 0, "")
    assert reporter.fetches == 1  # the second member used the cached archive
    second = (runner.data_dir / "logs" / "job-1" / "attempt-2-rank-0.log").read_text()
    assert f"gpuplatform: bundle {digest[:12]} cached" in second


def test_a_refused_bundle_fails_the_member_for_good(make_runner, tmp_path):
    archive, digest = tar_gz({"../x": b"evil"})
    reporter = OwnCode(archive)
    runner = make_runner(reporter)
    runner.launch(Work(argv=["{python}", "x"], bundle=digest, rank=1))
    finished = run_until_finished(runner)
    assert finished[2] == "bundle: member 1: entry '../x' leaves the work dir"
    assert not (tmp_path / "work" / "job-1" / "x").exists()
    run_failure = reporter.failures[-1]
    assert run_failure == "final"  # reported with retryable: false


def test_a_deleted_secret_fails_the_member_with_a_clear_reason(make_runner):
    error = ApiError(
        'GET /members/1/0/secrets/: 410 {"detail": "secret HF_TOKEN was deleted"}', 410
    )
    runner = make_runner(OwnCode(secrets_error=error))
    runner.launch(Work(argv=["true"], secrets=["HF_TOKEN"]))
    assert run_until_finished(runner)[2] == "secrets: member 0: secret HF_TOKEN was deleted"


@pytest.fixture(autouse=True)
def _record_failure_kind(monkeypatch):
    """What the HTTP reporter would send: the run's failure kind, beside the finish."""

    def finished(self, run, exit_code, reason, checkpoint):
        self.events.append(("finished", exit_code, reason))
        self.__dict__.setdefault("failures", []).append(run.failure)

    monkeypatch.setattr(OwnCode, "finished", finished)


def test_a_bundles_requirements_build_an_environment_the_job_imports_from(make_runner, tmp_path,
                                                                          monkeypatch):  # fmt: skip
    from tests.unit.test_envs import write_wheel

    write_wheel(tmp_path / "wheels")
    monkeypatch.setenv("GPUPLATFORM_PIP_NO_INDEX", "1")
    monkeypatch.setenv("GPUPLATFORM_PIP_FIND_LINKS", str(tmp_path / "wheels"))
    script = b"import sys, gpuplatform_tinydep as t; print('dep', t.VERSION, sys.prefix)\n"
    archive, digest = tar_gz({"main.py": script, "requirements.txt": b"gpuplatform-tinydep==1.0\n"})
    runner = make_runner(OwnCode(archive))
    runner.launch(Work(argv=["python", "main.py"], bundle=digest))  # `python` from its PATH
    assert run_until_finished(runner) == ("finished", 0, "")
    log = (runner.data_dir / "logs" / "job-1" / "attempt-1-rank-0.log").read_text()
    assert "gpuplatform: building environment" in log and "+ gpuplatform-tinydep==1.0" in log
    assert f"dep 1.0 {runner.data_dir / 'envs'}" in log

    runner.reporter.events.clear()
    # The body's list wins over the file: here it asks for nothing the wheel dir lacks.
    runner.launch(Work(argv=["python", "main.py"], bundle=digest, attempt_id=2, attempt_number=2,
                       python_requirements=["gpuplatform-tinydep"]))  # fmt: skip
    assert run_until_finished(runner) == ("finished", 0, "")
    log = (runner.data_dir / "logs" / "job-1" / "attempt-2-rank-0.log").read_text()
    assert "the bundle's requirements.txt is ignored" in log

    runner.reporter.events.clear()
    runner.launch(Work(argv=["python", "main.py"], bundle=digest, attempt_id=3, attempt_number=3))
    assert run_until_finished(runner) == ("finished", 0, "")
    log = (runner.data_dir / "logs" / "job-1" / "attempt-3-rank-0.log").read_text()
    assert "reused" in log and "building" not in log


def test_a_failed_environment_build_fails_the_member_for_good(make_runner, tmp_path, monkeypatch):
    monkeypatch.setenv("GPUPLATFORM_PIP_NO_INDEX", "1")
    monkeypatch.setenv("GPUPLATFORM_PIP_FIND_LINKS", str(tmp_path))
    reporter = OwnCode()
    runner = make_runner(reporter)
    runner.launch(Work(argv=["python", "-c", "pass"], python_requirements=["not-on-this-node==1"]))
    reason = run_until_finished(runner, timeout=60)[2]
    assert reason.startswith("environment: No solution found") and "not-on-this-node" in reason
    assert reporter.failures[-1] == "final"


def test_a_member_cancelled_while_it_is_prepared_never_runs(make_runner, tmp_path, monkeypatch):
    from tests.unit.test_envs import write_wheel

    write_wheel(tmp_path / "wheels")
    monkeypatch.setenv("GPUPLATFORM_PIP_NO_INDEX", "1")
    monkeypatch.setenv("GPUPLATFORM_PIP_FIND_LINKS", str(tmp_path / "wheels"))
    marker = tmp_path / "ran"
    reporter = OwnCode()
    runner = make_runner(reporter)
    runner.launch(Work(argv=["touch", str(marker)], python_requirements=["gpuplatform-tinydep"]))
    runner.stop(1, 0, why="cancel")
    finished = run_until_finished(runner)
    assert finished[2] == "stopped before it started: cancel"
    assert reporter.failures[-1] == ""  # reported as the cancel it was: the platform says cancelled
    assert not marker.exists()
