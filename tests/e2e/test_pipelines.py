"""A pipeline on the real platform (docs/pipelines.md): preprocess (an array) -> train (an array,
aftercorr on preprocess: task i after task i) -> evaluate (a job, afterok on the train array),
through the web, the dispatcher and the agents as separate processes. Each step reads its
dependencies' artifacts through the agent (gpuplatform_job.inputs / read_input); the evaluate
job reads every train task's."""

import json
from datetime import datetime

import pytest

pytestmark = pytest.mark.e2e

TASK = {"gpus": 1, "gpu_sku": "H100-80GB", "max_runtime_seconds": 120}
# One line each: an argv holds no control characters (a newline neither).
PRE = (
    "import os, pathlib; i = os.environ['GPUPLATFORM_ARRAY_INDEX']; "
    "pathlib.Path(os.environ['GPUPLATFORM_OUTPUT_DIR'], 'data.txt').write_text(f'shard {i}')"
)
TRAIN = (  # its one input is task i of preprocess (aftercorr), and only it
    "import os, pathlib, gpuplatform_job as job; i = os.environ['GPUPLATFORM_ARRAY_INDEX']; "
    "[data] = job.inputs(); shard = job.read_input(data['job'], 'data.txt').decode(); "
    "assert shard == f'shard {i}', (shard, i); "
    "pathlib.Path(os.environ['GPUPLATFORM_OUTPUT_DIR'], 'model.txt').write_text(f'model {i} trained on {shard}')"
)
EVALUATE = (
    "import json, os, pathlib, gpuplatform_job as job; "
    "models = {str(m['array_index']): job.read_input(m['job'], m['name']).decode() for m in job.inputs()}; "
    "pathlib.Path(os.environ['GPUPLATFORM_OUTPUT_DIR'], 'report.json').write_text(json.dumps({'models': models}))"
)


def _at(stamp: str) -> datetime:
    return datetime.fromisoformat(stamp.replace("Z", "+00:00"))


def command(source: str) -> list[str]:
    return ["{python}", "-c", source]


def tasks(platform, array_id: str) -> list[dict]:
    return platform.get("bob", f"/api/v1/jobs/?array={array_id}&page_size=100").json()["results"]


def test_preprocess_then_train_array_aftercorr_then_evaluate_afterok_reads_every_model(platform):
    pre = platform.submit("bob", **TASK, name="preprocess", array="0-3", command=command(PRE))
    train = platform.submit("bob", **TASK, name="train", array="0-3", command=command(TRAIN),
                            depends_on=[{"array": pre["id"], "condition": "aftercorr"}])  # fmt: skip
    evaluate = platform.submit("bob", **TASK, name="evaluate", command=command(EVALUATE),
                               depends_on=[{"array": train["id"], "condition": "afterok"}])  # fmt: skip
    assert evaluate["state"] == "queued" and evaluate["queue_position"] is None
    assert evaluate["reason"] == f"waiting for dependency array {train['id']} (afterok)"

    done = platform.wait_for_state(evaluate["id"], ("succeeded", "failed"), timeout=90)
    pre_tasks, train_tasks = tasks(platform, pre["id"]), tasks(platform, train["id"])
    assert done["state"] == "succeeded", (
        done["reason"],
        [(t["state"], t["reason"]) for t in train_tasks],
    )
    assert [t["state"] for t in pre_tasks + train_tasks] == ["succeeded"] * 8
    # In order: train task i started after preprocess task i ended, evaluate after every train task.
    ended = {t["array_index"]: _at(t["finished_at"]) for t in pre_tasks}
    for task in train_tasks:
        assert _at(task["started_at"]) >= ended[task["array_index"]]
        assert task["depends_on"] == [
            {"array": pre["id"], "condition": "aftercorr", "state": "satisfied"}
        ]
    assert _at(done["started_at"]) >= max(_at(t["finished_at"]) for t in train_tasks)
    assert done["depends_on"] == [
        {"array": train["id"], "condition": "afterok", "state": "satisfied"}
    ]
    report = platform.get("bob", f"/api/v1/jobs/{evaluate['id']}/artifacts/report.json")
    assert report.status_code == 200, report.text
    assert json.loads(report.content)["models"] == {
        str(i): f"model {i} trained on shard {i}" for i in range(4)
    }


def test_a_failed_step_fails_the_rest_of_the_pipeline_at_once(platform):
    first = platform.submit("bob", **TASK, name="fails", command=["false"])
    second = platform.submit("bob", **TASK, name="second", command=["true"],
                             depends_on=[{"job": first["id"], "condition": "afterok"}])  # fmt: skip
    third = platform.submit("bob", **TASK, name="third", command=["true"],
                            depends_on=[{"job": second["id"], "condition": "afterok"}])  # fmt: skip
    platform.wait_for_state(first["id"], "failed", timeout=60)
    assert platform.job(second["id"])["state"] == "failed"  # with the parent, not later
    last = platform.job(third["id"])
    assert (last["state"], last["reason"]) == (
        "failed",
        f"dependency {second['id']} failed (afterok)",
    )
