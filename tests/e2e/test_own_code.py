"""Own code on the real platform (issue 17, the node side): a bundle uploaded through the API,
fetched by the node through its agent API, unpacked into the job's work dir, its requirements.txt
built into an environment with uv (offline: a wheel dir this test writes), the job's env var and
secret set, the secret `***` in the stored log; a second job reuses the node's cached bundle and
environment; a bundle that would write outside its work dir fails the job for good."""

import hashlib
import io
import pathlib
import tarfile

import pytest

from tests.e2e.platform import Platform
from tests.unit.test_envs import write_wheel

pytestmark = pytest.mark.e2e

NODE = "oc-1"
SECRET = "oc-tok-9d2e7a51c4"
MAIN = b"""import json, os, pathlib, gpuplatform_tinydep as dep
print("dep", dep.VERSION, "from", dep.__file__)
print("token=" + os.environ["OC_TOKEN"], "note=" + os.environ["OC_NOTE"])
print("data", pathlib.Path("data/input.txt").read_text().strip())
pathlib.Path(os.environ["GPUPLATFORM_OUTPUT_DIR"], "result.json").write_text(json.dumps({"ok": True}))
"""


class OwnCodePlatform(Platform):
    """Agents that build job environments offline, from the wheel dir only."""

    wheels: pathlib.Path

    def agent_environment(self, node: str) -> dict[str, str]:
        env = super().agent_environment(node)
        env.update(GPUPLATFORM_PIP_NO_INDEX="1", GPUPLATFORM_PIP_FIND_LINKS=str(self.wheels))
        return env


@pytest.fixture(scope="module")
def platform(tmp_path_factory):
    data = tmp_path_factory.mktemp("own-code")
    platform = OwnCodePlatform(data, name="gpuplatform_e2e_own_code", own_redis=True)
    platform.wheels = data / "wheels"
    write_wheel(platform.wheels)
    try:
        yield platform.start({NODE: ("H100-80GB", 2, "rack=r1")})
    finally:
        platform.stop()


def tar_gz(files: dict[str, bytes]) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size, info.mode = len(data), 0o644
            tar.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


def upload(platform, user: str, archive: bytes) -> str:
    response = platform.api(user).post(platform.url + "/api/v1/bundles/", data=archive, timeout=30,
                                       headers={"Content-Type": "application/gzip"})  # fmt: skip
    assert response.status_code in (200, 201), response.text
    assert response.json()["sha256"] == hashlib.sha256(archive).hexdigest()
    return response.json()["sha256"]


def log_of(platform, job_id: str) -> str:
    return platform.get("bob", f"/api/v1/jobs/{job_id}/logs/").text


def test_a_job_runs_its_bundle_in_a_node_built_env_with_a_masked_secret_then_reuses_both(platform):
    made = platform.post("alice", "/api/v1/secrets/", {"name": "OC_TOKEN", "value": SECRET})
    assert made.status_code == 201, made.text
    archive = tar_gz({"main.py": MAIN, "requirements.txt": b"gpuplatform-tinydep==1.0\n",
                      "data/input.txt": b"forty-two\n"})  # fmt: skip
    digest = upload(platform, "bob", archive)
    body = {"command": ["python", "main.py"], "bundle": digest, "env": {"OC_NOTE": "hi"},
            "secrets": ["OC_TOKEN"], "gpus": 1, "gpu_sku": "H100-80GB"}  # fmt: skip

    first = platform.submit("bob", **body)
    done = platform.wait_for_state(first["id"], ["succeeded", "failed"], timeout=120)
    log = log_of(platform, first["id"])
    assert done["state"] == "succeeded", (done["reason"], log, platform.logs(f"agent-{NODE}"))
    # reported running as its preparation began (its lease renewed meanwhile), one attempt
    assert len(done["attempts"]) == 1 and done["attempts"][0]["started_at"]
    assert f"gpuplatform: bundle {digest[:12]} fetched ({len(archive)} bytes)" in log
    assert "gpuplatform: building environment" in log and "+ gpuplatform-tinydep==1.0" in log
    (dep,) = [line for line in log.splitlines() if line.startswith("dep 1.0 from")]
    assert str(platform.agent_dir(NODE) / "envs") in dep  # the node-built environment's copy
    assert "token=*** note=hi" in log and SECRET not in log  # masked before it was stored
    assert "data forty-two" in log  # it ran in the unpacked bundle
    result = platform.get("bob", f"/api/v1/jobs/{first['id']}/artifacts/result.json")
    assert result.json() == {"ok": True}

    second = platform.submit("bob", **body)
    assert (
        platform.wait_for_state(second["id"], ["succeeded", "failed"], timeout=60)["state"]
        == "succeeded"
    )
    log = log_of(platform, second["id"])
    assert f"gpuplatform: bundle {digest[:12]} cached" in log
    assert "reused" in log.split("gpuplatform: environment ", 1)[1].splitlines()[0]
    assert "building environment" not in log and SECRET not in log


def test_a_bundle_that_writes_outside_its_work_dir_fails_for_good(platform):
    digest = upload(platform, "bob", tar_gz({"../escaped.txt": b"evil"}))
    job = platform.submit("bob", command=["python", "-c", "pass"], bundle=digest, gpus=1,
                          gpu_sku="H100-80GB", retry_on_failure=True)  # fmt: skip
    done = platform.wait_for_state(job["id"], ["succeeded", "failed"], timeout=60)
    assert done["state"] == "failed"
    assert done["reason"] == "bundle: member 0: entry '../escaped.txt' leaves the work dir"
    assert len(done["attempts"]) == 1  # not retried, though the job asked for retries
    assert not list(platform.agent_dir(NODE).rglob("escaped.txt"))
