"""Each rank of a gang resumes from its own stored checkpoint (apps/jobs/checkpoints.py), through
the agent API as the agents call it: any bytes, one file per rank, whichever rank ends last."""

import io

from apps.jobs import services
from apps.nodes.credentials import issue_credential
from apps.scheduling.dispatcher import dispatch_once
from tests.agent_http import agent_api
from tests.factories import make_node
from tests.unit.test_agent_api import cast  # noqa: F401 (the fixture)
from tests.unit.test_dispatcher import submit


def _members(attempt):
    """Each member's agent client and assignment, by rank."""
    found = {}
    for member in attempt.members.select_related("node"):
        api = agent_api(issue_credential(node_name=member.node.name)[1])
        found[member.rank] = (api, api.assignment(attempt.pk, member.rank, str(attempt.token)))
    return found


def _a_gang_running(the_cast):
    """A two-node gang placed on h1 and h2, both members started: the job, its first attempt,
    and each member's agent client and assignment by rank."""
    make_node("h1", gpus=1)
    make_node("h2", gpus=1)
    job = submit(the_cast, gpus=1, nodes=2)
    dispatch_once()
    first = job.attempts.get()
    members = _members(first)
    for rank in members:
        services.attempt_member_started(
            attempt_id=first.pk, rank=rank, token=str(first.token), pid=1
        )
    return job, first, members


def test_each_rank_resumes_from_its_own_bytes_whichever_rank_ended_last(cast, settings, tmp_path):  # noqa: F811
    settings.MEDIA_ROOT = tmp_path
    job, first, members = _a_gang_running(cast)
    blobs = {0: b"\x80\x02rank0-weights\x00\xff", 1: b"PK\x03\x04rank1-shard\x00"}
    stored = {rank: api.put_checkpoint(a, "model.pt", io.BytesIO(blobs[rank]))
              for rank, (api, a) in members.items()}  # fmt: skip
    assert stored[1] == f"checkpoints/{job.pk}/attempt-1/rank-1/model.pt"
    api0, a0 = members[0]
    assert api0.report(a0, "progress", progress=0.4, checkpoint=stored[0])
    services.job_preempt(job=job, actor="test", reason="test")
    assert api0.report(a0, "finished", exit_code=0, reason="", checkpoint=stored[0])
    api1, a1 = members[1]  # rank 1 ends last: the attempt's checkpoint stays rank 0's
    assert api1.report(a1, "finished", exit_code=0, reason="", checkpoint=stored[1])
    first.refresh_from_db()
    assert first.checkpoint == stored[0]

    dispatch_once()
    second = job.attempts.get(number=2)
    for rank, (api, a) in _members(second).items():
        path = api.get_checkpoint(a, tmp_path / f"node-of-rank-{rank}")
        assert open(path, "rb").read() == blobs[rank], f"rank {rank} got another rank's checkpoint"
        assert path.endswith("model.pt")


def test_a_rank_that_stored_nothing_starts_afresh(cast, settings, tmp_path):  # noqa: F811
    settings.MEDIA_ROOT = tmp_path
    job, first, members = _a_gang_running(cast)
    api0, a0 = members[0]
    stored = api0.put_checkpoint(a0, "checkpoint.json", io.BytesIO(b'{"step": 3}'))
    assert api0.report(a0, "progress", progress=0.4, checkpoint=stored)
    services.job_preempt(job=job, actor="test", reason="test")
    for api, a in members.values():
        api.report(a, "finished", exit_code=0, reason="", checkpoint="")
    dispatch_once()
    second = job.attempts.get(number=2)
    got = {
        rank: api.get_checkpoint(a, tmp_path / f"r{rank}")
        for rank, (api, a) in _members(second).items()
    }
    assert got[0].endswith("checkpoint.json") and got[1] == ""


def test_a_late_rank_resumes_from_its_own_after_rank_0_saved_anew(cast, settings, tmp_path):  # noqa: F811
    """Rank 0 of the next attempt can start, and store and report a checkpoint, before rank 1 on
    a busy node asks for its own: rank 1 still gets what it saved in the attempt before (CI saw
    it start at step 0 instead)."""
    settings.MEDIA_ROOT = tmp_path
    job, first, members = _a_gang_running(cast)
    stored = {rank: api.put_checkpoint(a, "model.bin", io.BytesIO(f"step 21 of {rank}".encode()))
              for rank, (api, a) in members.items()}  # fmt: skip
    services.job_preempt(job=job, actor="test", reason="test")
    for rank, (api, a) in members.items():
        assert api.report(a, "finished", exit_code=0, reason="", checkpoint=stored[rank])

    dispatch_once()
    second = job.attempts.get(number=2)
    again = _members(second)
    api0, a0 = again[0]
    services.attempt_member_started(attempt_id=second.pk, rank=0, token=str(second.token), pid=2)
    assert open(api0.get_checkpoint(a0, tmp_path / "r0"), "rb").read() == b"step 21 of 0"
    newer = api0.put_checkpoint(a0, "model.bin", io.BytesIO(b"step 22 of 0"))
    assert api0.report(a0, "progress", progress=0.5, checkpoint=newer)
    second.refresh_from_db()
    assert second.checkpoint == newer

    api1, a1 = again[1]
    assert open(api1.get_checkpoint(a1, tmp_path / "r1"), "rb").read() == b"step 21 of 1"
