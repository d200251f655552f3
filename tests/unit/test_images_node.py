"""The node's image steps without a fence (workers/images.py): an agent that does not fence its
jobs fails an image job at once; a registry that does not answer is tried with backoff, then
fails the job; skopeo's error text loses any part of the credentials; the image's config under
the submit's (argv and environment)."""

from __future__ import annotations

import socket
import time
from dataclasses import dataclass, field

import pytest

from apps.platform.images import parse
from tests.unit.test_runner import Recorder, Work
from workers import images
from workers.isolation import unfenced
from workers.runner import Runner


@dataclass
class ImageWork(Work):
    image: str = "127.0.0.1:5000/team/box:v1"
    image_digest: str = ""
    image_auth: bool = False
    bundle: str = ""
    env: dict = field(default_factory=dict)
    secrets: list = field(default_factory=list)
    python_requirements: list = field(default_factory=list)


class Reporter(Recorder):
    def started(self, run):
        return True

    def finished(self, run, exit_code, reason, checkpoint):
        self.events.append(("finished", exit_code, reason, run.failure))


def test_an_unfenced_agent_fails_an_image_job_at_once_and_for_good(tmp_path):
    runner = Runner(node="n1", data_dir=tmp_path, reporter=Reporter(), kill_grace=1.0,
                    isolation=unfenced("unit test"))  # fmt: skip
    assert runner.launch(ImageWork(argv=["true"]))
    deadline = time.monotonic() + 20
    while runner.reporter.finish() is None and time.monotonic() < deadline:
        runner.tick()
        time.sleep(0.05)
    _, code, reason, failure = runner.reporter.finish()
    assert "images run only on a node that fences jobs" in reason and failure == "final"


def test_a_registry_that_does_not_answer_is_tried_with_backoff_then_fails(tmp_path):
    if images.shutil.which("skopeo") is None:
        pytest.skip("needs Debian's skopeo (`make images`)")
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # closed once the block ends: nothing listens there
    cache = images.ImageCache(tmp_path / "images", insecure=[f"127.0.0.1:{port}"])
    began = time.monotonic()
    with pytest.raises(images.PullFailed) as failed:
        cache.resolve(parse(f"127.0.0.1:{port}/team/box:v1"), None)
    assert "does not answer" in failed.value.reason and failed.value.final
    assert time.monotonic() - began >= 3  # 1 s, then 2 s between the 3 tries


def test_the_error_text_loses_the_credentials():
    stderr = 'time="x" level=fatal msg="auth robot:hunter2-pw failed for hunter2-pw"\n'
    why = images._why(stderr, "robot:hunter2-pw")
    assert "hunter2-pw" not in why and "***" in why


def test_the_images_config_under_the_submits():
    image = images.Image(digest="sha256:" + "a" * 64, rootfs=None, entrypoint=["/entry"],  # type: ignore[arg-type]
                         cmd=["serve"], env=["PATH=/opt/bin:/bin", "A=image", "B=image"])  # fmt: skip
    assert images.command(image, []) == ["/entry", "serve"]
    assert images.command(image, ["train"]) == ["/entry", "train"]
    env = images.environment(image, {"B": "submit", "PATH": "/usr/bin", "PYTHONPATH": "/sdk"})
    assert env == {"A": "image", "B": "submit", "PATH": "/opt/bin:/bin"}


@pytest.mark.parametrize(
    ("reference", "stderr", "said"),
    [
        # The registry's port holds "403": still "not found" (CI's registry once listened on 34403).
        ("127.0.0.1:34403/team/nothing:v1",
         'Error parsing image name "docker://127.0.0.1:34403/team/nothing:v1": reading manifest v1 '
         "in 127.0.0.1:34403/team/nothing: manifest unknown: manifest unknown", "not found"),
        ("127.0.0.1:5000/denied/box:v1",
         "reading manifest v1 in 127.0.0.1:5000/denied/box: manifest unknown", "not found"),
        ("127.0.0.1:4040/team/box:v1",
         "reading manifest v1 in 127.0.0.1:4040/team/box: unauthorized: authentication required",
         "the registry refused the credentials"),
    ],
)  # fmt: skip
def test_a_registrys_answer_is_read_without_the_images_own_names(
    tmp_path, monkeypatch, reference, stderr, said
):
    failed = images.subprocess.CompletedProcess([], 1, stdout="", stderr=stderr)
    monkeypatch.setattr(images, "_run", lambda argv: failed)
    cache = images.ImageCache(tmp_path / "images")
    with pytest.raises(images.PullFailed) as raised:
        cache._tried(["skopeo"], parse(reference), None)
    assert f"{reference}: {said}" in raised.value.reason


def test_members_preparing_at_once_share_one_image_cache(tmp_path, monkeypatch):
    """The caches are made at first use from several prepare threads: one of each, or a cap set
    on one would not hold for the other (the eviction test failed 3 runs in 8 that way)."""
    import threading

    from workers.prepare import Preparer

    made = images.ImageCache

    def slow(*args, **kwargs):
        time.sleep(0.05)  # the window in which a second thread would make its own
        return made(*args, **kwargs)

    monkeypatch.setattr(images, "ImageCache", slow)
    preparer, seen = Preparer(tmp_path), []
    threads = [threading.Thread(target=lambda: seen.append(preparer.images)) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len({id(cache) for cache in seen}) == 1
