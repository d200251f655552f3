"""Placement of jobs in an OCI image (docs/images.md): only on a node whose agent fences its jobs,
never on one that does not, even where the operator opted that node in to unisolated commands;
with no fencing node at all the job stays queued, its reason saying why."""

import pytest

from apps.admission import enqueue
from apps.jobs import services
from apps.jobs.models import Job, JobState
from apps.nodes.models import GpuSku
from apps.scheduling.dispatcher import dispatch_once
from tests.factories import make_cast, make_node

FENCED = "uid+cgroup+mountns"


@pytest.fixture
def cast(db):
    return make_cast()


def submit(cast, *, image: str = "") -> Job:
    person = cast["bob"][0]
    tenant = person.membership.tenant  # acme: allowed commands
    spec = services.JobSpec(
        name="t", tier=tenant.tier, template=None, params={}, command=["true"], gpus=1, nodes=1,
        gpu_sku=GpuSku.objects.get_or_create(name="H100-80GB")[0], node_selector={},
        max_runtime_seconds=60, checkpointable=False, cacheable=False, image=image,
    )  # fmt: skip
    return enqueue.job_submit(tenant=tenant, user=person, spec=spec)


def node_of(job: Job) -> str:
    return job.attempts.get().allocations.get().gpu.node.name


def test_image_jobs_go_to_the_fencing_node_only(cast):
    make_node("a-open", gpus=2)  # unfenced, opted in to commands (the factory's default)
    make_node("b-fenced", gpus=1, isolation=FENCED)
    first, second = (submit(cast, image="127.0.0.1:5000/team/box:v1") for _ in range(2))
    dispatch_once()
    for job in (first, second):
        job.refresh_from_db()
    placed = [job for job in (first, second) if job.state != JobState.QUEUED]
    assert [node_of(job) for job in placed] == ["b-fenced"]  # one GPU there; none on a-open
    plain = submit(cast)
    dispatch_once()
    plain.refresh_from_db()
    assert plain.state != JobState.QUEUED and node_of(plain) == "a-open"


def test_with_no_fencing_node_an_image_job_waits_saying_why(cast):
    make_node("a-open", gpus=8)
    make_node("c-open", gpus=8, allow_unisolated_commands=False)
    imaged = submit(cast, image="127.0.0.1:5000/team/box:v1")
    plain = submit(cast)
    dispatch_once()
    imaged.refresh_from_db()
    plain.refresh_from_db()
    assert imaged.state == JobState.QUEUED and not imaged.attempts.exists()
    assert imaged.reason.startswith("needs 1 node(s)")
    assert "runs only on a node that fences its jobs" in imaged.reason, imaged.reason
    assert plain.state != JobState.QUEUED  # a job without an image still runs there
