"""Bundles through a real web (gunicorn with the Procfile's ASGI worker, and plain WSGI
gunicorn): uploads with a Content-Length and chunked ones (no length), dedupe, HEAD, the cap's
413 on a chunked body, and a submit that names the bundle (docs/own-code.md)."""

from __future__ import annotations

import hashlib
import io
import json
import os
import subprocess
import sys
import tarfile
import time

import pytest
import requests

from tests.e2e.platform import ROOT, Platform

pytestmark = pytest.mark.e2e

SIZE = int(os.environ.get("GPUPLATFORM_BUNDLE_E2E_MIB", 8)) * 1024 * 1024  # 50: the bench size


def archive(size: int, seed: bytes = b"") -> bytes:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w:gz", compresslevel=1) as tar:
        payload = seed + os.urandom(size)
        info = tarfile.TarInfo("weights.bin")
        info.size = len(payload)
        tar.addfile(info, io.BytesIO(payload))
        script = b"print(open('weights.bin','rb').read(4))\n"
        info = tarfile.TarInfo("train.py")
        info.size = len(script)
        tar.addfile(info, io.BytesIO(script))
    return out.getvalue()


def chunks(data: bytes, size: int = 256 * 1024):
    for start in range(0, len(data), size):
        yield data[start : start + size]


@pytest.fixture(scope="module", params=["asgi", "wsgi"])
def web(request, tmp_path_factory):
    platform = Platform(tmp_path_factory.mktemp(f"bundles-{request.param}"),
                        name=f"gpuplatform_bundles_{request.param}", redis_db=8)  # fmt: skip
    try:
        platform.manage("migrate", "--noinput", "-v", "0")
        seed = subprocess.run([sys.executable, "-m", "tests.e2e.seed"], cwd=ROOT, env=platform.env,
                              check=True, capture_output=True, text=True)  # fmt: skip
        platform.tokens = json.loads(seed.stdout.strip().splitlines()[-1])
        if request.param == "asgi":
            platform.start_web()
        else:
            platform.spawn("web", [sys.executable, "-m", "gunicorn", "gpuplatform.wsgi", "--bind",
                                   f"127.0.0.1:{platform.port}", "--workers", "1", "--threads", "2",
                                   "--timeout", "60"])  # fmt: skip
        platform.wait_until(platform.ready, timeout=90, what="web answering")
        yield platform
    finally:
        platform.stop()


def post(web, body, user: str = "bob") -> requests.Response:
    return web.api(user).post(f"{web.url}/api/v1/bundles/", data=body, timeout=60,
                              headers={"Content-Type": "application/gzip"})  # fmt: skip


def test_upload_dedupe_head_and_a_submit_through_the_real_web(web):
    data = archive(SIZE)
    digest = hashlib.sha256(data).hexdigest()
    head = web.api("bob").head(f"{web.url}/api/v1/bundles/{digest}/", timeout=10)
    assert head.status_code == 404
    started = time.monotonic()
    first = post(web, data)
    took = time.monotonic() - started
    assert first.status_code == 201, first.text
    assert first.json()["sha256"] == digest and first.json()["size"] == len(data)
    print(f"upload of {len(data)} bytes: {took:.2f} s")
    assert post(web, data).status_code == 200
    assert web.api("bob").head(f"{web.url}/api/v1/bundles/{digest}/", timeout=10).status_code == 200
    assert (
        web.api("dave").head(f"{web.url}/api/v1/bundles/{digest}/", timeout=10).status_code == 404
    )
    job = web.api("bob").post(f"{web.url}/api/v1/jobs/", timeout=30,
                              json={"command": ["python", "train.py"], "bundle": digest, "gpus": 0})  # fmt: skip
    assert job.status_code == 201, job.text
    assert job.json()["bundle"] == digest


def test_a_chunked_upload_is_stored_whole(web):
    data = archive(2 * 1024 * 1024, seed=b"chunked")
    response = post(web, chunks(data))  # a generator: requests sends Transfer-Encoding: chunked
    assert response.status_code == 201, response.text
    assert response.json()["sha256"] == hashlib.sha256(data).hexdigest()
    assert response.json()["size"] == len(data)


def test_a_chunked_upload_over_the_cap_is_413_naming_it(web):
    web.manage("shell", "-c", "from apps.tenants.models import Tenant; "
               "Tenant.objects.filter(slug='acme').update(bundle_max_mib=1)")  # fmt: skip
    try:
        response = post(web, chunks(archive(3 * 1024 * 1024, seed=b"big")))
        assert response.status_code == 413, response.text
        assert "1 MiB" in response.json()["body"][0]
        sized = post(web, archive(3 * 1024 * 1024, seed=b"big2"))
        assert sized.status_code == 413
        assert "1 MiB" in sized.json()["body"][0] and "bytes" in sized.json()["body"][0]
    finally:
        web.manage("shell", "-c", "from apps.tenants.models import Tenant; "
                   "Tenant.objects.filter(slug='acme').update(bundle_max_mib=None)")  # fmt: skip
