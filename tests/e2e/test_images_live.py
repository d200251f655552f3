"""Images on the real platform (issue 34): the web, the dispatcher and a root agent that fences
its jobs; an image built here and served by docker-registry on loopback with basic auth. A job
with `image` and `image_pull_secret` runs the image's Cmd in its root and gets its `image_digest`
from the node's first pull; a second job finds it cached; without the secret the job fails at
once (one attempt) naming the image; a registry outside GPUPLATFORM_IMAGE_REGISTRIES is a 400;
the password is in no process's log and no job log. Skips where the tools or the fence are
missing."""

import pytest

from tests.e2e.platform import Platform
from tests.oci_images import Registry, build_image, need_tools

pytestmark = pytest.mark.e2e

NODE = "img-1"
PASSWORD = "e2e-pull-pass-4b9d-VALUE"  # noqa: S105 (a test's value)


class ImagePlatform(Platform):
    registry: Registry

    def agent_environment(self, node: str) -> dict[str, str]:
        env = super().agent_environment(node)
        env["GPUPLATFORM_INSECURE_REGISTRIES"] = self.registry.host
        return env


@pytest.fixture(scope="module")
def live(tmp_path_factory):
    need_tools()
    data = tmp_path_factory.mktemp("images-live")
    registry = Registry(data / "registry", user="robot", password=PASSWORD)
    layout = build_image(data / "image", marker="live-marker", env=["PATH=/bin", "FOO=img"],
                         cmd=["sh", "-c", "echo cmd-ran foo=$FOO; cat /MARKER"])  # fmt: skip
    digest = registry.push(layout, "v1", "team/box:v1")
    platform = ImagePlatform(data, name="gpuplatform_e2e_images", own_redis=True,
                             env={"GPUPLATFORM_IMAGE_REGISTRIES": registry.host})  # fmt: skip
    platform.registry = registry
    try:
        platform.start({NODE: ("H100-80GB", 2, "")})
        isolation = platform.nodes()[NODE].get("isolation", "")
        if isolation == "none":
            pytest.skip("the test agent does not fence jobs here (not root, no cgroups)")
        yield platform, registry, digest
    finally:
        platform.stop()
        registry.stop()


def log_of(platform, job_id: str) -> str:
    return platform.get("bob", f"/api/v1/jobs/{job_id}/logs/").text


def test_a_job_runs_in_its_image_is_pinned_cached_and_the_secret_stays_secret(live):
    platform, registry, digest = live
    image = f"{registry.host}/team/box:v1"
    made = platform.post("alice", "/api/v1/secrets/", {"name": "REG", "value": f"robot:{PASSWORD}"})
    assert made.status_code == 201, made.text
    refused = platform.post("bob", "/api/v1/jobs/", {"image": "docker.io/library/x:1", "gpus": 0})
    assert refused.status_code == 400 and "image" in refused.json()

    job = platform.submit("bob", image=image, image_pull_secret="REG", gpus=1)
    done = platform.wait_for_state(job["id"], {"succeeded", "failed"}, timeout=120)
    log = log_of(platform, job["id"])
    assert done["state"] == "succeeded", (done["reason"], log)
    assert done["image"] == image and done["image_digest"] == digest
    assert "cmd-ran foo=img" in log and "live-marker" in log

    again = platform.submit("bob", image=image, image_pull_secret="REG", gpus=1)
    assert platform.wait_for_state(again["id"], {"succeeded", "failed"})["state"] == "succeeded"
    assert f"image {digest.split(':')[1][:12]} cached" in log_of(platform, again["id"])

    without = platform.submit("bob", image=image, command=["true"], gpus=1)
    failed = platform.wait_for_state(without["id"], {"succeeded", "failed"}, timeout=120)
    assert failed["state"] == "failed" and image in failed["reason"], failed
    assert "refused the credentials" in failed["reason"] and len(failed["attempts"]) == 1

    for name in platform.processes:
        assert PASSWORD not in platform.logs(name, tail=100000), name
    for job_id in (job["id"], again["id"], without["id"]):
        assert PASSWORD not in log_of(platform, job_id)
        assert PASSWORD not in platform.get("bob", f"/api/v1/jobs/{job_id}/").text
