"""Blocking per resource pool: one pool's backlog never idles another (issue 18), and the queue
is walked whole in order of standing however long it is."""

import time

from apps.scheduling.core import ClusterManager, Node, Placement, Pod
from apps.scheduling.core.policy import (
    PolicyConfig,
    Preempt,
    QueuedJob,
    Reserve,
    RunningJob,
    Scheduler,
    Start,
    Wait,
    decide,
    default_tiers,
)


def job(job_id, *, tenant="t", tier="free", gpus=1, nodes=1, submit=0.0, est=100.0, **kw):
    return QueuedJob(job_id, tenant, tier, gpus, submit, est, nodes=nodes, **kw)


def started(decisions):
    return [d.job_id for d in decisions if isinstance(d, Start)]


def two_pools(blocked: int, config: PolicyConfig | None = None) -> Scheduler:
    """A busy H100 node (an enterprise job no one may preempt), an idle A100 node, and
    `blocked` enterprise jobs for the H100 node queued ahead of everything else."""
    s = Scheduler(ClusterManager(), default_tiers(), config)
    s.add_node(Node("h100", 8, "H100"))
    s.add_node(Node("a100", 8, "A100"))
    s.submit(job("busy", tenant="e0", tier="enterprise", gpus=8, gpu_models=("H100",), est=10_000))
    assert started(s.decide(0)) == ["busy"]
    for i in range(blocked):
        s.submit(job(f"e{i}", tenant=f"e{i % 3}", tier="enterprise", gpus=4, submit=1 + i,
                     est=3600, gpu_models=("H100",)))  # fmt: skip
    return s


def test_a_job_for_an_idle_pool_starts_behind_60_blocked_jobs_of_another():
    s = two_pools(60)
    s.submit(job("pro-a100", tenant="p", tier="pro", gpus=2, submit=100, gpu_models=("A100",)))
    decisions = s.decide(1)
    assert started(decisions) == ["pro-a100"]
    reserved = [d for d in decisions if isinstance(d, Reserve)]
    assert [d.nodes for d in reserved] == [("h100",)]  # the H100 queue keeps its reservation


def test_the_same_through_the_stateless_seam_with_reasons():
    s = two_pools(60)
    queued = list(s.queued.values()) + [
        job("pro-a100", tenant="p", tier="pro", gpus=2, submit=100, gpu_models=("A100",))
    ]
    cluster = ClusterManager()
    cluster.add_node(Node("h100", 8, "H100"))
    cluster.add_node(Node("a100", 8, "A100"))
    busy = cluster.schedule_pod(Pod("busy", gpus=8, gpu_models=("H100",)))
    running = [RunningJob("busy", "e0", "enterprise", 8, 0.0, 10_000.0, busy)]
    decisions = decide(1.0, cluster, [QueuedJob(**_fields(q)) for q in queued], running,
                       default_tiers())  # fmt: skip
    assert started(decisions) == ["pro-a100"]
    reasons = {d.job_id: d.reason for d in decisions if isinstance(d, Wait)}
    behind = [j for j, r in reasons.items() if r.startswith("behind 48 jobs in queue order")]
    assert len(behind) == 60 - 48  # the H100 pool's misses are spent; the A100 job went on


def _fields(q: QueuedJob) -> dict:
    return {name: getattr(q, name) for name in QueuedJob.__slots__ if name != "seq"}


def test_a_reservation_holds_its_own_pool_only():
    s = two_pools(1)
    # Runs far past e0's reservation on h100, but on the A100 node it binds nothing.
    s.submit(job("long-a100", tenant="p", tier="pro", gpus=8, submit=5, est=1e6,
                 gpu_models=("A100",)))  # fmt: skip
    decisions = s.decide(1)
    assert started(decisions) == ["long-a100"]
    assert [d.nodes for d in decisions if isinstance(d, Reserve)] == [("h100",)]


def test_each_pool_keeps_its_own_reservation():
    s = two_pools(2)
    s.submit(job("a-fill", tenant="p", tier="pro", gpus=8, submit=3, est=500, gpu_models=("A100",)))
    assert started(s.decide(1)) == ["a-fill"]
    s.submit(job("a-wide", tenant="p", tier="pro", gpus=8, submit=4, est=500, gpu_models=("A100",)))
    decisions = s.decide(2, explain=True)  # a full pass (without, only the arrival is looked at)
    reserved = {d.job_id: d.nodes for d in decisions if isinstance(d, Reserve)}
    assert reserved.pop("a-wide") == ("a100",)  # the A100 queue's own head holds the A100 node
    assert list(reserved.values()) == [("h100",)]


def test_a_pool_whose_window_is_spent_does_not_stop_the_pass():
    s = two_pools(10, PolicyConfig(backfill_depth=3))
    s.submit(job("pro-a100", tenant="p", tier="pro", gpus=1, submit=100, gpu_models=("A100",)))
    assert started(s.decide(1)) == ["pro-a100"]


def test_a_pass_with_every_pool_blocked_stops_early():
    s = two_pools(5000)
    began = time.process_time()
    decisions = s.decide(1)
    assert started(decisions) == []
    assert time.process_time() - began < 0.5  # stops after 48 misses, the rest is not looked at


def test_an_enterprise_job_behind_50000_free_jobs_preempts_in_the_first_pass():
    """A full cluster of preemptible free work past its minimum runtime, 50,000 free jobs queued,
    then one enterprise job: the first pass preempts for it (the dispatcher's seam)."""
    nodes, per_node = 125, 8
    cluster = ClusterManager()
    running = []
    for n in range(nodes):
        cluster.add_node(Node(f"n{n}", per_node, "H100"))
    for n in range(nodes):
        placement = cluster.schedule_pod(Pod(f"r{n}", gpus=per_node))
        assert isinstance(placement, Placement)
        running.append(RunningJob(f"r{n}", f"f{n % 7}", "free", per_node, 0.0, 86_400.0,
                                  placement))  # fmt: skip
    queued = [job(f"q{i}", tenant=f"f{i % 7}", submit=1.0 + i * 1e-3) for i in range(50_000)]
    queued.append(job("ent", tenant="big", tier="enterprise", gpus=8, submit=3600.0, est=600))
    began = time.process_time()
    decisions = decide(3600.0, cluster, queued, running, default_tiers())
    cpu = time.process_time() - began
    preempts = [d for d in decisions if isinstance(d, Preempt)]
    assert [p.for_job_id for p in preempts] == ["ent"]
    assert len(preempts[0].victim_ids) == 1
    assert cpu < 5.0
