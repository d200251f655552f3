"""Jobs in an OCI image (docs/images.md), through the Runner as root: the image's root as the job's
`/` (its marker file, its Env, a root listing with nothing of the host), its Cmd as the default,
the cache (`image <digest12> cached`, one pull for two jobs at once), the digest fixed at the
first pull and kept across a re-tag, a reference by @sha256, a private registry with and without
its credentials (a failure at once, the password nowhere), the job's own uid whatever the image's
USER, a setuid binary giving nothing, only its own GPUs' device files, its own layer.

Images are built here (tests/oci_images.py) and served by docker-registry on loopback; each test
skips where the tools or the fence are missing."""

from __future__ import annotations

import itertools
import os
import time
import uuid
from dataclasses import dataclass, field

import pytest

from tests.isolation.conftest import Job, Keyed, fenced_runner, log_of
from tests.oci_images import Registry, build_image, need_tools
from tests.runners import stop_runner
from workers import image_driver, images

PASSWORD = "pull-pass-7c1e-VALUE"  # noqa: S105 (a test's value)
ENV = ["PATH=/bin", "FOO=from-image", "BAR=image-bar"]
CMD = ["sh", "-c", "echo cmd-ran; cat /MARKER"]
ATTEMPTS = itertools.count(1)


@dataclass
class ImageJob(Job):
    image: str = ""
    image_digest: str = ""
    image_auth: bool = False
    bundle: str = ""
    env: dict = field(default_factory=dict)
    secrets: list = field(default_factory=list)
    python_requirements: list = field(default_factory=list)


class Reporter(Keyed):
    """The agent API's image endpoint as the platform answers: the first digest is kept."""

    def __init__(self, auth: str | None = None):
        super().__init__()
        self.auth, self.fixed, self.auth_reads = auth, "", 0
        self.failures: dict = {}

    def finished(self, run, exit_code, reason, checkpoint):
        self.failures[run.key] = run.failure  # "final": never retried
        super().finished(run, exit_code, reason, checkpoint)

    def started(self, run):
        return True

    def image_auth(self, run):
        self.auth_reads += 1
        return self.auth

    def image_digest(self, run, digest):
        self.fixed = self.fixed or digest
        return self.fixed


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    need_tools()
    top = tmp_path_factory.mktemp("oci")
    one = build_image(top / "one", marker="marker-one", env=ENV, cmd=CMD, working_dir="/srv",
                      user="0", setuid_copy=True)  # fmt: skip
    two = build_image(top / "two", marker="marker-two", env=ENV, cmd=CMD)
    bare = build_image(top / "bare", marker="bare", env=ENV, cmd=[])
    registry = Registry(top / "open")
    private = Registry(top / "private", user="robot", password=PASSWORD)
    digests = {
        "one": registry.push(one, "v1", "team/box:v1"),
        "two": registry.push(two, "v1", "team/other:v1"),
        "private": private.push(one, "v1", "team/box:v1"),
        "bare": registry.push(bare, "v1", "team/bare:v1"),
    }
    yield registry, private, digests, (one, two)
    registry.stop()
    private.stop()


@pytest.fixture
def run_image(tmp_path, monkeypatch, served):
    registry, private, _, _ = served
    monkeypatch.setenv("GPUPLATFORM_INSECURE_REGISTRIES", f"{registry.host},{private.host}")
    made = []

    def start(image: str, argv: list[str], *, reporter=None, runner=None, **fields):
        if runner is None:
            runner = fenced_runner(tmp_path / f"agent-{len(made)}", fake_gpus=4)
            runner.reporter = reporter or Reporter()
            made.append(runner)
        attempt = next(ATTEMPTS)
        fields.setdefault("gpu_indices", [1])
        job = ImageJob(argv=argv, attempt_id=attempt, job_id=f"job-{attempt}", image=image,
                       **fields)  # fmt: skip
        assert runner.launch(job)
        return runner, (attempt, 0)

    yield start
    for runner in made:
        stop_runner(runner)


def ended(runner, key, timeout: float = 60) -> tuple:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        runner.tick()
        done = [e for e in runner.reporter.events if e[0] == "finished" and e[3] == key]
        if done:
            return done[0][1:3]
        time.sleep(0.05)
    raise AssertionError(f"{key} did not finish: {runner.reporter.events}\n{log_of(runner, key)}")


def test_a_job_runs_in_the_image_as_its_own_uid_with_nothing_of_the_host(run_image, served):
    registry, _, digests, _ = served
    script = (
        "echo marker=$(cat /MARKER); echo foo=$FOO bar=$BAR; echo root=$(ls / | tr '\\n' ' '); "
        "echo uid=$(id -u); echo cwd=$(pwd); echo dev=$(ls /dev | tr '\\n' ' '); "
        "echo suid=$(/bin/busybox-suid id -u); cat /etc/passwd >/dev/null 2>&1 || echo no-passwd; "
        "touch /etc/x 2>/dev/null || echo image-read-only; echo mine > /scratch/mine; "
        "ls /proc | grep -c '^[0-9]' > /tmp/pids; echo pids=$(cat /tmp/pids)"
    )
    runner, key = run_image(f"{registry.host}/team/box:v1", ["sh", "-c", script],
                            env={"BAR": "from-submit"})  # fmt: skip
    assert ended(runner, key) == (0, ""), log_of(runner, key)
    log = log_of(runner, key)
    lines = dict(
        line.split("=", 1)
        for line in log.splitlines()
        if "=" in line and " " not in line.split("=")[0]
    )
    assert lines["marker"] == "marker-one"
    assert lines["foo"].startswith("from-image") and "bar=from-submit" in log  # the submit's wins
    root = set(lines["root"].split())
    assert root <= {"bin", "etc", "MARKER", "scratch", "srv", "proc", "dev", "tmp"}, root
    assert {"usr", "home", "root", "var", "work", "opt"}.isdisjoint(root)
    assert (
        lines["uid"] != "0" and lines["suid"] == lines["uid"]
    )  # the image's USER 0 and setuid: nothing
    assert lines["cwd"] == "/srv"  # its WorkingDir (no bundle)
    assert set(lines["dev"].split()) == {"nvidia1", "null", "zero", "full", "random", "urandom",
                                         "tty", "shm"}  # fmt: skip
    assert "no-passwd" in log and "image-read-only" in log
    assert int(lines["pids"]) <= 5  # hidepid: only its own uid's processes (the host has dozens)
    rootfs = runner.preparer.images.root / "roots" / digests["one"].split(":")[1] / "rootfs"
    assert not (rootfs / "scratch" / "mine").exists()  # its write went to its own layer
    assert os.stat(rootfs / "bin" / "busybox-suid").st_mode & 0o4000  # setuid in the image
    assert runner.reporter.fixed == digests["one"]  # the first pull reports the digest


def test_the_images_cmd_runs_by_default_and_the_second_job_uses_the_cache(run_image, served):
    registry, _, digests, _ = served
    runner, first = run_image(f"{registry.host}/team/box:v1", [])
    assert ended(runner, first) == (0, "")
    assert "cmd-ran\nmarker-one" in log_of(runner, first)
    assert f"image {digests['one'].split(':')[1][:12]} pulling" in log_of(runner, first)
    _, second = run_image(f"{registry.host}/team/box:v1", [], runner=runner)
    assert ended(runner, second) == (0, "")
    assert f"image {digests['one'].split(':')[1][:12]} cached" in log_of(runner, second)


def test_the_digest_fixed_at_the_first_pull_survives_a_retag(run_image, served):
    registry, _, digests, (_, two) = served
    target = f"team/moving-{uuid.uuid4().hex[:6]}:v1"
    pushed = registry.push(served[3][0], "v1", target)
    reporter = Reporter()
    runner, first = run_image(f"{registry.host}/{target}", ["cat", "/MARKER"], reporter=reporter)
    assert ended(runner, first) == (0, "") and "marker-one" in log_of(runner, first)
    assert reporter.fixed == pushed
    registry.push(two, "v1", target)  # the tag now names another image
    _, requeued = run_image(f"{registry.host}/{target}", ["cat", "/MARKER"], runner=runner,
                            image_digest=reporter.fixed)  # fmt: skip
    assert ended(runner, requeued) == (0, "")
    assert "marker-one" in log_of(runner, requeued) and "marker-two" not in log_of(runner, requeued)


def test_a_reference_by_sha256(run_image, served):
    registry, _, digests, _ = served
    runner, key = run_image(f"{registry.host}/team/other@{digests['two']}", ["cat", "/MARKER"])
    assert ended(runner, key) == (0, "") and "marker-two" in log_of(runner, key)


def test_a_private_registry_with_its_secret_and_without(run_image, served):
    _, private, _, _ = served
    image = f"{private.host}/team/box:v1"
    good = Reporter(auth=f"robot:{PASSWORD}")
    runner, key = run_image(image, ["cat", "/MARKER"], reporter=good, image_auth=True)
    assert ended(runner, key) == (0, "") and "marker-one" in log_of(runner, key)
    began = time.monotonic()
    bad = Reporter(auth="robot:wrong-password-VALUE")
    other, refused = run_image(image, ["true"], reporter=bad, image_auth=True)
    code, reason = ended(other, refused)
    assert code is None or code != 0
    assert "refused the credentials" in reason and image in reason
    assert other.reporter.failures[refused] == "final"
    assert time.monotonic() - began < 20  # at once: no retries with backoff
    none, anonymous = run_image(image, ["true"], reporter=Reporter(), runner=other)
    assert "refused the credentials" in ended(other, anonymous)[1]
    for where in (reason, log_of(other, refused), log_of(runner, key)):
        assert PASSWORD not in where and "wrong-password-VALUE" not in where
    assert not os.listdir(runner.preparer.images.root / "auth")  # the auth file is gone


def test_concurrent_jobs_share_one_pull(run_image, served):
    registry, _, digests, _ = served
    runner, first = run_image(f"{registry.host}/team/other:v1", ["true"])
    _, second = run_image(f"{registry.host}/team/other:v1", ["true"], runner=runner)
    assert ended(runner, first) == (0, "") and ended(runner, second) == (0, "")
    logs = log_of(runner, first) + log_of(runner, second)
    short = digests["two"].split(":")[1][:12]
    assert logs.count(f"image {short} pulling") == 1 and logs.count(f"image {short} cached") == 1


def test_where_overlayfs_is_refused_each_job_gets_a_private_copy(run_image, served, monkeypatch):
    registry, _, _, _ = served
    monkeypatch.setattr(images, "overlay_works", lambda root: False)
    runner, key = run_image(
        f"{registry.host}/team/box:v1", ["sh", "-c", "cat /MARKER; echo x > /scratch/y"]
    )
    assert ended(runner, key) == (0, ""), log_of(runner, key)
    assert "private copy" in log_of(runner, key) and "marker-one" in log_of(runner, key)


def test_an_image_that_does_not_exist_fails_at_once(run_image, served):
    registry, _, _, _ = served
    runner, key = run_image(f"{registry.host}/team/nothing:v1", ["true"])
    code, reason = ended(runner, key)
    assert "not found" in reason and "team/nothing" in reason


def test_an_image_without_cmd_or_entrypoint_and_no_command_fails_saying_so(run_image, served):
    registry, _, _, _ = served
    runner, key = run_image(f"{registry.host}/team/bare:v1", [])
    code, reason = ended(runner, key)
    assert "no Entrypoint or Cmd" in reason
    assert runner.reporter.failures[key] == "final"


def test_the_hosts_driver_is_bound_read_only_for_a_job_with_gpus(run_image, served, tmp_path,
                                                                 monkeypatch):  # fmt: skip
    """A stand-in driver (this machine may have none): a library and an `nvidia-smi` that the
    discovery names, bound read-only at /usr/local/nvidia and on the job's paths."""
    registry, _, _, _ = served
    (tmp_path / "libnvidia-ml.so.1").write_text("the host's NVML\n")
    smi = tmp_path / "nvidia-smi"
    smi.write_text("#!/bin/sh\necho fake-smi ran on $(ls /dev | grep nvidia | tr '\\n' ' ')\n")
    smi.chmod(0o755)
    for path in (tmp_path, tmp_path / "libnvidia-ml.so.1"):
        path.chmod(path.stat().st_mode | 0o055)
    found = [(str(tmp_path / "libnvidia-ml.so.1"), f"{image_driver.LIB_DIR}/libnvidia-ml.so.1"),
             (str(smi), f"{image_driver.BIN_DIR}/nvidia-smi")]  # fmt: skip
    monkeypatch.setattr(image_driver, "discover", lambda: list(found))
    script = ("nvidia-smi; cat /usr/local/nvidia/lib64/libnvidia-ml.so.1; echo libs=$LD_LIBRARY_PATH; "
              "echo x >> /usr/local/nvidia/lib64/libnvidia-ml.so.1 || echo lib-read-only")  # fmt: skip
    runner, key = run_image(f"{registry.host}/team/box:v1", ["sh", "-c", script])
    assert ended(runner, key) == (0, ""), log_of(runner, key)
    log = log_of(runner, key)
    assert "fake-smi ran on nvidia1" in log and "the host's NVML" in log
    assert "libs=/usr/local/nvidia/lib64" in log and "lib-read-only" in log
    assert "NVIDIA driver in the image: 2 files" in log
    assert (tmp_path / "libnvidia-ml.so.1").read_text() == "the host's NVML\n"
    _, bare = run_image(f"{registry.host}/team/box:v1", ["sh", "-c", "ls /usr/local/nvidia || echo none"],
                        runner=runner, gpu_indices=[])  # fmt: skip
    assert ended(runner, bare) == (0, "")
    assert "none" in log_of(runner, bare) and "NVIDIA driver" not in log_of(runner, bare)
