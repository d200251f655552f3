"""A command job submitted without a name is named after its script, not its interpreter."""

import pytest

BASE = {"gpus": 1, "gpu_sku": "H100-80GB"}


@pytest.mark.parametrize("command, name", [
    (["python", "train.py", "--lr", "3e-4"], "train"),
    (["python3.11", "-u", "src/finetune.py"], "finetune"),
    (["torchrun", "--nproc_per_node", "2", "ddp.py"], "ddp"),
    (["python", "-m", "pkg.main"], "pkg.main"),
    (["./run.sh"], "run"),
    (["nvidia-smi", "-L"], "nvidia-smi"),
    (["python", "-c", "print(1)"], "python"),
])  # fmt: skip
def test_a_command_jobs_default_name_is_its_script(as_user, command, name):
    response = as_user("bob").post("/api/v1/jobs/", {**BASE, "command": command}, format="json")
    assert response.status_code == 201, response.json()
    assert response.json()["name"] == name


def test_a_given_name_stays(as_user):
    body = {**BASE, "command": ["python", "train.py"], "name": "mine"}
    assert as_user("bob").post("/api/v1/jobs/", body, format="json").json()["name"] == "mine"
