"""Reasons leak nothing (issue 30): a job waiting behind a reservation names the holder as "your
job <id>" only when it is its own tenant's, else by standing; times are ISO 8601, never epoch
seconds. Preemption reasons (shown to the victims) name the preemptor's tier, not its id."""

import re

from apps.scheduling.core import ClusterManager, Node, Pod
from apps.scheduling.core.policy import (
    Preempt,
    QueuedJob,
    Reserve,
    RunningJob,
    Wait,
    decide,
    default_tiers,
)

NOW = 1_796_577_000.0  # a real clock: epoch seconds, as the dispatcher's
EPOCH = re.compile(r"\b1\d{9}(\.\d+)?\b")
ISO = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ")


def job(job_id, tenant, tier, gpus, submit, est):
    return QueuedJob(job_id, tenant, tier, gpus, submit, est)


def scene():
    cluster = ClusterManager()
    cluster.add_node(Node("n1", 8, "H100"))
    placement = cluster.schedule_pod(Pod("busy-secret-id", gpus=4))
    running = [RunningJob("busy-secret-id", "acme", "enterprise", 4, NOW - 100, NOW + 1000,
                          placement)]  # fmt: skip
    queued = [
        job("head-secret-id", "acme", "enterprise", 8, NOW - 50, 600),
        job("acme-long", "acme", "enterprise", 4, NOW - 40, 5000),
        job("globex-long", "globex", "free", 4, NOW - 30, 5000),
    ]
    return decide(NOW, cluster, queued, running, default_tiers())


def test_the_reservation_and_the_waits_name_times_in_iso_and_no_epoch():
    decisions = scene()
    reserve = next(d for d in decisions if isinstance(d, Reserve))
    assert reserve.job_id == "head-secret-id"
    for d in decisions:
        text = getattr(d, "reason", "")
        assert not EPOCH.search(text), text
        assert "t=" not in text, text
    assert ISO.search(reserve.reason), reserve.reason


def test_another_tenants_wait_names_no_foreign_job_only_its_standing():
    waits = {d.job_id: d.reason for d in scene() if isinstance(d, Wait)}
    theirs = waits["globex-long"]
    assert "secret-id" not in theirs and "a job of a higher tier" in theirs, theirs
    assert ISO.search(theirs), theirs
    # The holder's own tenant is told which of its jobs holds the GPUs.
    assert "your job head-secret-id" in waits["acme-long"], waits["acme-long"]


def test_a_preemption_reason_names_the_tier_not_the_job():
    cluster = ClusterManager()
    cluster.add_node(Node("n1", 8, "H100"))
    placement = cluster.schedule_pod(Pod("victim", gpus=8))
    running = [RunningJob("victim", "globex", "free", 8, NOW - 7200, NOW + 7200, placement)]
    queued = [job("preemptor-secret-id", "acme", "enterprise", 8, NOW - 10, 600)]
    preempt = next(d for d in decide(NOW, cluster, queued, running, default_tiers())
                   if isinstance(d, Preempt))  # fmt: skip
    assert "secret-id" not in preempt.reason and "tier enterprise" in preempt.reason
