"""A head-of-line reservation checks the filters placement checks (issue 31): a blocked job never
holds a node its selector excludes or whose taint it does not tolerate, however soon that node
frees; it reserves the node it can use."""

from apps.scheduling.core import ClusterManager, Node, Pod
from apps.scheduling.core.policy import QueuedJob, Reserve, RunningJob, decide, default_tiers


def cluster_with(b_taints=(), b_labels=None):
    cluster = ClusterManager()
    cluster.add_node(Node("a", 8, "H100", labels={"zone": "a", "host": "a"}))
    labels = {**(b_labels or {"zone": "b"}), "host": "b"}
    cluster.add_node(Node("b", 8, "H100", labels=labels, taints=b_taints))
    running = []
    for name, node, end in (("on-a", "a", 1000.0), ("on-b", "b", 50.0)):
        placement = cluster.schedule_pod(Pod(name, gpus=8, node_selector={"host": node},
                                             tolerations=("*",)))  # fmt: skip
        running.append(RunningJob(name, "t", "enterprise", 8, 0.0, end, placement))
    return cluster, running


def reserved(cluster, running, job):
    decisions = decide(1.0, cluster, [job], running, default_tiers())
    return [d for d in decisions if isinstance(d, Reserve)]


def test_a_job_whose_selector_excludes_the_node_freeing_first_reserves_its_own():
    cluster, running = cluster_with()
    job = QueuedJob("j", "u", "pro", 8, 0.5, 600, node_selector={"zone": "a"})
    [resv] = reserved(cluster, running, job)
    assert resv.nodes == ("a",) and resv.at == 1000.0


def test_a_job_that_does_not_tolerate_a_taint_never_holds_that_node():
    cluster, running = cluster_with(b_taints=("dedicated=ml:NoSchedule",), b_labels={"zone": "a"})
    job = QueuedJob("j", "u", "pro", 8, 0.5, 600)
    [resv] = reserved(cluster, running, job)
    assert resv.nodes == ("a",) and resv.at == 1000.0
    tolerant = QueuedJob("k", "u", "pro", 8, 0.5, 600, tolerations=("dedicated=ml:NoSchedule",))
    [resv] = reserved(cluster, running, tolerant)
    assert resv.nodes == ("b",) and resv.at == 50.0
