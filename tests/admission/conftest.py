import pathlib
import time

import pytest

from apps.admission import buckets
from apps.jobs.models import Job, JobAttempt
from apps.jobs.services import artifact_store, attempt_member_finished, attempt_member_started
from apps.scheduling.dispatcher import dispatch_once
from apps.tenants.models import Tenant
from apps.tenants.services import quota_set
from tests.factories import client_for, make_cast, make_node

INFER = {
    "template": "demo-infer",
    "params": {"prompt": "hello", "max_tokens": 4},
    "gpus": 1,
    "gpu_sku": "H100-80GB",
}
TRAIN = {"template": "demo-train", "params": {"steps": 2}, "gpus": 1, "gpu_sku": "H100-80GB"}


def wait_until(condition, seconds: float = 2.0) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.01)
    return condition()


@pytest.fixture
def token_listener():
    """This process's revocation listener subscribed (apps/tenants/token_cache.py): its first
    subscription drops every cache of the channel (what came before it may have missed a
    message), which would drop a test's first entry."""
    from apps.tenants import token_cache

    token_cache.CACHE.listen()
    assert wait_until(token_cache.CACHE.listener.subscribed.is_set, 10)


@pytest.fixture(autouse=True)
def fresh_buckets():
    """Buckets are keyed by database ids, which a rolled-back test gives out again."""
    conn = buckets.client()
    for key in conn.scan_iter(f"{buckets.PREFIX}*"):
        conn.delete(key)


def generous(slug: str) -> None:
    quota_set(
        tenant=Tenant.objects.get(slug=slug), submit_rate_per_minute=100_000, submit_burst=100_000
    )


@pytest.fixture
def cast(db):
    people = make_cast()
    make_node("h1", "H100-80GB", 8)
    generous("acme")
    generous("globex")
    return people


@pytest.fixture
def as_user(cast):
    def client(name: str):
        return client_for(cast[name][1])

    return client


def run_to_end(
    job_id,
    *,
    exit_code: int = 0,
    output: bytes | None = b'{"text": "a GPU job"}',
    tmp: pathlib.Path,
):
    """Play the agent: start the placed attempt, store its output, report its end."""
    attempt = JobAttempt.objects.filter(job_id=job_id).order_by("-number").first()
    assert attempt is not None, "the job was never placed"
    member = attempt.members.get(rank=0)
    attempt_member_started(attempt_id=attempt.pk, rank=0, token=str(attempt.token), pid=1)
    if output is not None and exit_code == 0:
        path = tmp / f"{job_id}-output.json"
        path.write_bytes(output)
        artifact_store(
            attempt_id=attempt.pk, token=str(attempt.token), name="output.json", path=path
        )
    attempt_member_finished(
        attempt_id=attempt.pk, rank=member.rank, token=str(attempt.token), exit_code=exit_code
    )
    return Job.objects.get(pk=job_id)


def placed_ids() -> set[str]:
    return set(dispatch_once().placed)


@pytest.fixture
def parked(cast):
    """A cordoned 64-GPU H100 node: a job of 64 GPUs could run on it some day, so it is accepted
    (a submit no node could ever fit is a 400, apps/admission/fit.py), and stays queued."""
    from apps.admission import fit
    from apps.nodes.models import Node, NodeState

    node = make_node("parked", "H100-80GB", 64)
    Node.objects.filter(pk=node.pk).update(state=NodeState.CORDONED)
    fit.forget()
    return node
