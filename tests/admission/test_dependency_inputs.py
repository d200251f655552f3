"""A pipeline's step reads its dependencies' artifacts (docs/pipelines.md): the agent API's
member inputs endpoints list and stream the artifacts of the member's job's parents, only
those, and only to the node the member is placed on; the agent downloads them
(workers/inputs.py) and the job's SDK reads them (gpuplatform_job.inputs, read_input)."""

import importlib
import sys

import pytest

from apps.jobs.models import Job, JobAttempt
from apps.jobs.selectors import assignment_for
from apps.jobs.services import attempt_member_started
from apps.nodes.credentials import issue_credential
from tests.admission.conftest import placed_ids, run_to_end
from tests.agent_http import agent_api
from tests.factories import make_node
from workers import inputs as agent_inputs
from workers.agent_client import ApiError

JOB = {"command": ["true"], "gpus": 1, "gpu_sku": "H100-80GB"}


def submit(client, **extra) -> str:
    response = client.post("/api/v1/jobs/", {**JOB, **extra}, format="json")
    assert response.status_code == 201, response.json()
    return response.json()["id"]


@pytest.fixture
def pipeline(as_user, tmp_path, settings):
    """Two parents that stored artifacts, an unrelated job that did too, and the child of the
    two, placed and started on h1."""
    settings.MEDIA_ROOT = tmp_path / "media"
    bob = as_user("bob")
    first, second, unrelated = submit(bob), submit(bob), submit(bob)
    assert {first, second, unrelated} <= placed_ids()
    run_to_end(first, output=b"weights-1", tmp=tmp_path)
    run_to_end(second, output=b"weights-2", tmp=tmp_path)
    run_to_end(unrelated, output=b"not yours", tmp=tmp_path)
    child = submit(bob, depends_on=[{"job": first, "condition": "afterok"},
                                    {"job": second, "condition": "afterany"}])  # fmt: skip
    assert child in placed_ids()
    attempt = JobAttempt.objects.get(job_id=child)
    attempt_member_started(attempt_id=attempt.pk, rank=0, token=str(attempt.token), pid=1)
    return {
        "first": first,
        "second": second,
        "unrelated": unrelated,
        "child": child,
        "attempt": attempt,
    }


def test_the_agent_fetches_the_parents_artifacts_and_the_sdk_reads_them(
    pipeline, tmp_path, monkeypatch
):
    attempt = pipeline["attempt"]
    member = attempt.members.get()
    work = assignment_for(member)
    assert work.inputs is True  # the agent fetches inputs for this job, and for it only
    api = agent_api(issue_credential(node_name=member.node.name)[1])
    listed = api.list_inputs(work)
    assert [(i["job"], i["name"]) for i in listed] == [
        (pipeline["first"], "output.json"),
        (pipeline["second"], "output.json"),
    ]  # only the parents', in the order named
    dest = tmp_path / "inputs"
    agent_inputs.fetch(api, work, dest)
    assert (dest / pipeline["first"] / "output.json").read_bytes() == b"weights-1"
    monkeypatch.setenv("GPUPLATFORM_INPUT_DIR", str(dest))
    monkeypatch.syspath_prepend("workers/sdk")
    sys.modules.pop("gpuplatform_job", None)
    sdk = importlib.import_module("gpuplatform_job")
    assert [(i["job"], i["name"], i["size"]) for i in sdk.inputs()] == [
        (pipeline["first"], "output.json", 9),
        (pipeline["second"], "output.json", 9),
    ]
    assert sdk.read_input(pipeline["second"], "output.json") == b"weights-2"
    with pytest.raises(KeyError):
        sdk.read_input(pipeline["unrelated"], "output.json")


def test_another_jobs_artifacts_another_node_and_an_ended_attempt_are_404(pipeline, tmp_path):
    attempt = pipeline["attempt"]
    work = assignment_for(attempt.members.get())
    api = agent_api(issue_credential(node_name="h1")[1])
    with pytest.raises(ApiError) as refused:
        api.get_input(work, pipeline["unrelated"], "output.json", tmp_path / "x")
    assert refused.value.status == 404  # not a parent of the job
    with pytest.raises(ApiError) as refused:
        api.get_input(work, pipeline["first"], "missing.bin", tmp_path / "x")
    assert refused.value.status == 404
    make_node("h2", "H100-80GB", 1)
    other = agent_api(issue_credential(node_name="h2")[1])
    with pytest.raises(ApiError) as refused:
        other.list_inputs(work)  # the right token from a node the member is not on
    assert refused.value.status == 404
    run_to_end(pipeline["child"], tmp=tmp_path)
    with pytest.raises(ApiError) as refused:
        api.list_inputs(work)  # the attempt has ended
    assert refused.value.status == 404


def test_a_job_without_dependencies_fetches_nothing(as_user):
    job = submit(as_user("bob"))
    assert job in placed_ids()
    member = JobAttempt.objects.get(job_id=job).members.get()
    assert assignment_for(member).inputs is False
    assert Job.objects.get(pk=job).has_dependencies is False
