"""A pass over a cluster that can take no work (no healthy GPU on a ready node, none held, no node
on its way: bench.slurm_peer's submit phase, every node lost) ends after its first reads when its
heads, tiers and cluster are as the last full pass saw them (apps/scheduling/dispatcher.py
`_Idle`); anything that could change what a pass does makes the next one full. Nothing is lost:
a submit made while a pass runs, full or not, is answered by a following pass."""

import time

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from apps.admission import fit
from apps.jobs.models import Job, JobState
from apps.nodes.models import Node, NodeState
from apps.scheduling import dispatcher, tasks
from apps.scheduling.dispatcher import dispatch_once
from apps.scheduling.redis import shared_client
from apps.tenants.models import Tier
from tests.factories import make_cast, make_node
from tests.unit.test_dispatcher import placed_and_started, submit
from tests.unit.test_h40disp_quiet import KEYS, clean_requests

LOST = "only a lost node could run it"


@pytest.fixture
def cast(db):
    return make_cast()


@pytest.fixture
def lost(cast):
    """Two nodes registered, both lost."""
    make_node("p0", gpus=4), make_node("p1", gpus=4)
    Node.objects.update(state=NodeState.LOST)
    fit.forget()
    yield cast
    fit.forget()  # the nodes' shapes are kept per process: the next test's are its own


@pytest.fixture
def full_passes(monkeypatch):
    """The passes that went past the idle check (the policy's decide ran)."""
    ran: list[int] = []
    decide = dispatcher.policy.decide

    def counted(*args, **kwargs):
        ran.append(1)
        return decide(*args, **kwargs)

    monkeypatch.setattr(dispatcher.policy, "decide", counted)
    return ran


@pytest.fixture
def redis_keys(monkeypatch):
    """A clean slate for the dispatch requests' keys; Celery messages recorded, not sent."""
    yield clean_requests(monkeypatch)
    shared_client().delete(*KEYS)


def reasons() -> dict:
    return dict(Job.objects.values_list("pk", "reason"))


def test_a_repeated_pass_over_a_lost_cluster_stops_after_its_first_reads(lost, full_passes):
    jobs = [submit(lost) for _ in range(3)]
    first = dispatch_once()
    assert first.futile and len(full_passes) == 1
    worded = reasons()
    assert all(LOST in worded[job.pk] for job in jobs)
    with CaptureQueriesContext(connection) as full:
        dispatcher._IDLE.forget()
        dispatch_once()
    with CaptureQueriesContext(connection) as idle:
        again = dispatch_once()
    assert again.futile and len(full_passes) == 2  # the forced full one only
    assert reasons() == worded
    statements = [query["sql"].lstrip().upper() for query in idle.captured_queries]
    assert not [sql for sql in statements if sql.startswith(("UPDATE", "INSERT", "DELETE"))]
    assert len(statements) < len(full.captured_queries) - 3  # no admission, usage, related rows


def test_a_new_head_makes_the_next_pass_full(lost, full_passes, monkeypatch):
    submit(lost)
    dispatch_once()
    late = submit(lost)
    reads: list[int] = []
    head_rows = dispatcher._head_rows
    monkeypatch.setattr(dispatcher, "_head_rows", lambda *a: reads.append(1) or head_rows(*a))
    dispatch_once()
    assert len(full_passes) == 2 and len(reads) == 1  # the idle check's read serves the pass
    late.refresh_from_db()
    assert LOST in late.reason


def test_a_node_back_at_work_makes_the_next_pass_full_and_places(lost, full_passes):
    job = submit(lost)
    dispatch_once()
    Node.objects.filter(name="p0").update(state=NodeState.READY)
    result = dispatch_once()
    assert result.placed == [str(job.pk)] and len(full_passes) == 2


def test_a_changed_tier_makes_the_next_pass_full(lost, full_passes):
    job = submit(lost)
    dispatch_once()
    Tier.objects.filter(pk=job.tier_id).update(weight=7)
    dispatch_once()
    assert len(full_passes) == 2


def test_a_full_pass_comes_at_least_every_idle_full_pass_s(lost, full_passes, monkeypatch):
    submit(lost)
    dispatch_once()
    dispatch_once()
    assert len(full_passes) == 1
    dispatcher._IDLE.at -= dispatcher.IDLE_FULL_PASS_S
    dispatch_once()
    assert len(full_passes) == 2


def test_a_cluster_with_a_job_holding_gpus_is_never_skipped(cast, full_passes):
    make_node("h1", gpus=1)
    placed_and_started(cast)  # the only GPU held
    submit(cast)
    first, second = dispatch_once(), dispatch_once()
    assert first.futile and second.futile  # no GPU free, nothing placed
    assert len(full_passes) == 3  # the placing pass, then both: a running job may be preempted


def test_a_submit_made_during_a_pass_is_placed_by_a_following_pass(cast, redis_keys, monkeypatch):
    make_node("h1", gpus=2)
    first = submit(cast)
    late: list[Job] = []
    decide = dispatcher.policy.decide

    def submit_meanwhile(*args, **kwargs):
        if not late:  # after the pass read its queue: the new job is not in it
            late.append(submit(cast))
            tasks.request_dispatch(after_submit=True)  # its commit's request
            tasks.dispatch()  # that request's task: the lock is held, it marks the holder
        return decide(*args, **kwargs)

    monkeypatch.setattr(dispatcher.policy, "decide", submit_meanwhile)
    tasks.dispatch()
    states = dict(Job.objects.values_list("pk", "state"))
    assert states[first.pk] != JobState.QUEUED and states[late[0].pk] != JobState.QUEUED


def test_a_submit_made_during_a_skipped_pass_is_worded_by_a_following_pass(lost, redis_keys,
                                                                          monkeypatch):  # fmt: skip
    submit(lost)
    tasks.dispatch()  # a full pass: futile, the next waits out QUIET_MS
    late: list[Job] = []
    same_heads = dispatcher._IDLE.same_heads

    def submit_after_the_check(*args, **kwargs):
        same = same_heads(*args, **kwargs)
        if not late:
            assert same  # this pass is skipped: it read its heads before the new job
            late.append(submit(lost))
            tasks.request_dispatch(after_submit=True)
            tasks.dispatch()
        return same

    monkeypatch.setattr(dispatcher._IDLE, "same_heads", submit_after_the_check)
    began = time.monotonic()
    tasks.dispatch()  # waits out the first pass's quiet, skips, waits again, then a full pass
    assert time.monotonic() - began >= 2 * tasks.QUIET_MS / 1000 * 0.8
    late[0].refresh_from_db()
    assert LOST in late[0].reason
