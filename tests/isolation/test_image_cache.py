"""The node's image cache (workers/images.py, docs/images.md): its cap, LRU order and never an
image in use (directly, and with a job running in it); the pull's progress lines; "too big"
before any layer is fetched, at once and for good; a second job on the image starting from the
cache without a second download (the registry's own access log counts the blob requests).

Images are built here (tests/oci_images.py) and served by docker-registry on loopback; each test
skips where the tools or the fence are missing."""

from __future__ import annotations

import io
import json
import logging
import os
import pathlib
import re
import threading
import time
import urllib.request

import pytest

from apps.platform.images import parse
from tests.isolation.conftest import log_of
from tests.isolation.test_images import Reporter, ended, run_image, served  # noqa: F401 (fixtures)
from tests.oci_images import need_tools
from workers import images


def layer_gets(registry, repository: str, digest: str) -> int:
    """Layer downloads the registry has answered for `repository` so far (its access log)."""
    request = urllib.request.Request(
        f"http://{registry.host}/v2/{repository}/manifests/{digest}",
        headers={"Accept": "application/vnd.oci.image.manifest.v1+json"},
    )
    with urllib.request.urlopen(request, timeout=10) as answer:  # noqa: S310 (loopback)
        layers = [layer["digest"] for layer in json.load(answer)["layers"]]
    text = pathlib.Path(registry.log.name).read_text(errors="replace")
    return sum(text.count(f'"GET /v2/{repository}/blobs/{layer} ') for layer in layers)


class PerJob(Reporter):
    """The platform's answer per job (several images on one runner here)."""

    def image_digest(self, run, digest):
        return self.__dict__.setdefault("digests", {}).setdefault(run.assignment.job_id, digest)


def short(digest: str) -> str:
    return digest.split(":", 1)[1][:12]


@pytest.fixture
def cache(tmp_path, served):  # noqa: F811
    need_tools()
    registry = served[0]
    return images.ImageCache(tmp_path / "images", insecure=[registry.host], cap_bytes=2**40)


def test_eviction_drops_the_least_recently_used_unused_image_never_one_in_use(
    cache,
    served,  # noqa: F811
    caplog,
):
    registry, _, digests, _ = served
    held = {}
    for name, repo in (("one", "team/box"), ("two", "team/other"), ("bare", "team/bare")):
        image, held[name] = cache.acquire(parse(f"{registry.host}/{repo}"), digests[name], None,
                                          io.BytesIO())  # fmt: skip
        assert image.rootfs.is_dir()
    roots = {name: cache.root / "roots" / digests[name].split(":")[1] for name in held}
    now = time.time()
    for age, name in ((300, "one"), (200, "two"), (100, "bare")):  # one: the least recently used
        os.utime(roots[name] / "ready", (now - age, now - age))
    cache.release(held.pop("two"))
    cache.release(held.pop("bare"))
    blobs = sorted((cache.layout / "blobs" / "sha256").iterdir())

    cache.cap = cache.size() - 1  # one image must go: the oldest one nobody uses is "two"
    assert cache.evict() == [roots["two"].name]
    assert roots["one"].is_dir() and roots["bare"].is_dir() and not roots["two"].exists()
    assert len(list((cache.layout / "blobs" / "sha256").iterdir())) < len(blobs)  # its blobs too

    cache.cap = 1  # nothing fits: every image not in use goes, "one" (in use) stays, said so
    with caplog.at_level(logging.WARNING, logger="workers.images"):
        assert cache.evict() == [roots["bare"].name]
    assert (roots["one"] / "rootfs" / "MARKER").read_text() == "marker-one"
    assert "in use by running jobs" in caplog.text and roots["one"].name[:12] in caplog.text

    cache.release(held.pop("one"))  # its job ended: now it may go
    assert cache.evict() == [roots["one"].name]
    head = io.BytesIO()
    cache.release(cache.acquire(parse(f"{registry.host}/team/box"), digests["one"], None, head)[1])
    assert f"image {short(digests['one'])} pulling" in head.getvalue().decode()  # pulled again


def test_a_running_job_keeps_its_image_through_an_eviction(run_image, served):  # noqa: F811
    registry, _, digests, _ = served
    wait = 'touch "$GPUPLATFORM_OUTPUT_DIR/up"; until [ -e "$GPUPLATFORM_OUTPUT_DIR/go" ]; do sleep 0.05; done'
    runner, busy = run_image(f"{registry.host}/team/box:v1", ["sh", "-c", f"{wait}; cat /MARKER"],
                             reporter=PerJob())  # fmt: skip
    runner.preparer.images.cap = 1  # every pull from here on finds the cache over its cap
    deadline, up = time.monotonic() + 30, []
    while not up and time.monotonic() < deadline:
        runner.tick()
        up = list(runner.runs[busy].workdir.rglob("up")) if busy in runner.runs else []
        time.sleep(0.05)
    assert up, log_of(runner, busy)
    _, other = run_image(f"{registry.host}/team/other:v1", ["true"], runner=runner)
    assert ended(runner, other) == (0, "")
    _, third = run_image(f"{registry.host}/team/bare:v1", ["true"], runner=runner)
    assert ended(runner, third) == (0, "")
    roots = runner.preparer.images.root / "roots"
    assert not (roots / digests["two"].split(":")[1]).exists()  # ended: evicted by the next pull
    assert (roots / digests["one"].split(":")[1] / "ready").exists()  # in use: kept
    (up[0].parent / "go").touch()
    assert ended(runner, busy) == (0, "")
    assert "marker-one" in log_of(runner, busy)


def test_a_pull_shows_its_size_layers_and_progress_in_the_log(run_image, served, monkeypatch):  # noqa: F811
    registry, _, digests, _ = served
    monkeypatch.setattr(images, "PROGRESS_EVERY", 0.0)  # a "fetched" line at each look
    runner, key = run_image(f"{registry.host}/team/other:v1", ["true"])
    assert ended(runner, key) == (0, "")
    log = log_of(runner, key)
    assert re.search(rf"image {short(digests['two'])} pulling \S+ \(\d+\.\d MB in 1 layer", log)
    assert re.search(rf"image {short(digests['two'])} layer 1/1 [0-9a-f]{{12}} \(\d+\.\d MB\)", log)
    fetched = re.findall(rf"image {short(digests['two'])} fetched ([\d.]+) of ([\d.]+) MB", log)
    assert fetched and float(fetched[-1][0]) >= float(fetched[-1][1]) > 0.5, log  # all of it


def test_an_image_over_the_limit_fails_at_once_without_a_download(run_image, served):  # noqa: F811
    registry, _, digests, _ = served
    runner, first = run_image(f"{registry.host}/team/box:v1", ["true"], reporter=PerJob())
    assert ended(runner, first) == (0, "")
    runner.preparer.images.max = 100_000  # 0.1 MB: busybox's layer is about 1 MB
    before = layer_gets(registry, "team/other", digests["two"])
    began = time.monotonic()
    _, key = run_image(f"{registry.host}/team/other:v1", ["true"], runner=runner)
    code, reason = ended(runner, key)
    assert code is None or code != 0
    assert "too big" in reason and "team/other" in reason and "0.1 MB" in reason
    assert runner.reporter.failures[key] == "final"  # no retry
    assert time.monotonic() - began < 20
    assert layer_gets(registry, "team/other", digests["two"]) == before  # nothing fetched
    assert not (runner.preparer.images.root / "roots" / digests["two"].split(":")[1]).exists()


def test_a_second_job_starts_from_the_cache_without_a_second_download(run_image, served):  # noqa: F811
    registry, _, digests, _ = served
    before = layer_gets(registry, "team/bare", digests["bare"])
    runner, first = run_image(f"{registry.host}/team/bare:v1", ["true"])
    assert ended(runner, first) == (0, "")
    pulled = layer_gets(registry, "team/bare", digests["bare"])
    assert pulled == before + 1  # its one layer
    _, second = run_image(f"{registry.host}/team/bare:v1", ["true"], runner=runner)
    assert ended(runner, second) == (0, "")
    assert f"image {short(digests['bare'])} cached" in log_of(runner, second)
    assert layer_gets(registry, "team/bare", digests["bare"]) == pulled  # no blob fetched again


def hexa(digest: str) -> str:
    return digest.split(":", 1)[1]


def tags(layout: pathlib.Path) -> list[str]:
    index = json.loads((layout / "index.json").read_text())
    return [m["annotations"]["org.opencontainers.image.ref.name"] for m in index["manifests"]]


def test_an_eviction_does_not_wait_for_another_images_download(cache, served):  # noqa: F811
    registry, _, digests, _ = served
    for name, repo in (("one", "team/box"), ("two", "team/other")):
        image, held = cache.acquire(parse(f"{registry.host}/{repo}"), digests[name], None,
                                    io.BytesIO())  # fmt: skip
        cache.release(held)
    now = time.time()
    os.utime(cache.root / "roots" / hexa(digests["one"]) / "ready", (now - 100, now - 100))
    blobs = len(list((cache.layout / "blobs" / "sha256").iterdir()))
    cache.cap = cache.size() - 1  # "one" (the least recently used) must go
    evicted: list = []
    with cache._locked("layout.lock"):  # another image's download holds the layout
        worker = threading.Thread(target=lambda: evicted.extend(cache.evict()), daemon=True)
        worker.start()
        worker.join(timeout=15)
        assert not worker.is_alive(), "the eviction waited for the download"
        assert evicted == [hexa(digests["one"])]
        assert not (cache.root / "roots" / hexa(digests["one"])).exists()
        assert cache.size() <= cache.cap  # its blobs, still there, are counted as gone
        assert len(list((cache.layout / "blobs" / "sha256").iterdir())) == blobs  # not yet
    worker.join(timeout=30)
    cache.cap = 2**40
    head = io.BytesIO()  # the next download drops the evicted image's tag and blobs
    cache.release(
        cache.acquire(parse(f"{registry.host}/team/bare"), digests["bare"], None, head)[1]
    )
    assert hexa(digests["one"]) not in tags(cache.layout) and hexa(digests["two"]) in tags(
        cache.layout
    )
    assert not list((cache.root / "locks").glob("*.drop"))
    head = io.BytesIO()  # and the evicted image is pulled again when a job wants it
    image, held = cache.acquire(parse(f"{registry.host}/team/box"), digests["one"], None, head)
    cache.release(held)
    assert f"image {short(digests['one'])} pulling" in head.getvalue().decode()
    assert (image.rootfs / "MARKER").read_text() == "marker-one"


def test_what_a_crash_left_half_done_is_removed_at_start_and_never_taken_for_an_image(
    cache,
    served,  # noqa: F811
    monkeypatch,
):
    registry, _, digests, _ = served
    cache.release(cache.acquire(parse(f"{registry.host}/team/box"), digests["one"], None,
                                io.BytesIO())[1])  # fmt: skip
    blobs = sorted(p.name for p in (cache.layout / "blobs" / "sha256").iterdir())
    pull = images._run

    def killed_while_unpacking(argv, **kwargs):
        if argv[:3] == [images.UMOCI, "raw", "unpack"]:
            pathlib.Path(argv[-1], "etc").mkdir(parents=True)  # half of a root
            raise KeyboardInterrupt  # stands for the agent's SIGKILL: nothing after runs
        return pull(argv, **kwargs)

    monkeypatch.setattr(images, "_run", killed_while_unpacking)
    with pytest.raises(KeyboardInterrupt):
        cache.acquire(parse(f"{registry.host}/team/other"), digests["two"], None, io.BytesIO())
    monkeypatch.setattr(images, "_run", pull)
    roots = cache.root / "roots"
    two = hexa(digests["two"])
    (roots / f".evicted-{hexa(digests['bare'])}-0a0b0c0d" / "rootfs").mkdir(parents=True)
    (roots / hexa(digests["bare"]) / "rootfs").mkdir(parents=True)  # a root with no `ready`
    (cache.layout / "oci-put-blob123456").write_bytes(b"partial")  # skopeo's partial download
    (cache.root / "auth" / "0123456789abcdef.json").write_text('{"auths": {}}')
    assert [p.name for p in roots.iterdir() if p.name.startswith(f".{two}.")]  # left half done
    assert two in tags(cache.layout)

    after = images.ImageCache(cache.root, insecure=[registry.host], cap_bytes=2**40)  # restart
    assert sorted(p.name for p in roots.iterdir()) == [hexa(digests["one"])]
    assert not list((after.root / "auth").iterdir())
    assert not (after.layout / "oci-put-blob123456").exists()
    assert list(tags(after.layout)) == [hexa(digests["one"])]
    assert sorted(p.name for p in (after.layout / "blobs" / "sha256").iterdir()) == blobs
    head = io.BytesIO()
    image, held = after.acquire(parse(f"{registry.host}/team/other"), digests["two"], None, head)
    after.release(held)
    assert f"image {short(digests['two'])} pulling" in head.getvalue().decode()
    assert (image.rootfs / "MARKER").read_text() == "marker-two"
