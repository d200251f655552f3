"""The plan (apps/scheduling/core/forecast.py): the policy run forward with jobs ending at their
predicted times, not at their limits; nodes being added join at their ready time."""

from apps.scheduling.core import ClusterManager, Node, Pod
from apps.scheduling.core.forecast import copy_cluster, forecast, quantile
from apps.scheduling.core.policy import ArrivingNode, QueuedJob, RunningJob, default_tiers

NOW = 1_000_000.0


def scene(nodes=1):
    cluster = ClusterManager()
    for i in range(nodes):
        cluster.add_node(Node(f"n{i}", 8, "H100"))
    placement = cluster.schedule_pod(Pod("busy", gpus=8))
    running = [RunningJob("busy", "acme", "pro", 8, NOW - 100, NOW + 3500, placement)]
    return cluster, running


def test_queued_jobs_start_when_the_running_job_ends_as_predicted_not_at_its_limit():
    cluster, running = scene()
    queued = [
        QueuedJob("a", "acme", "pro", 8, NOW - 50, 3600),
        QueuedJob("b", "acme", "pro", 4, NOW - 40, 3600),
    ]
    plan = forecast(NOW, cluster, queued, running, default_tiers(),
                    end_of=lambda job: job.started_at + 700, runtime_of=lambda job: 300)  # fmt: skip
    assert plan.starts == {"a": NOW + 600, "b": NOW + 900} and not plan.cut
    assert cluster.placement_of("busy") is not None and len(cluster.list_pods()) == 1  # unchanged


def test_a_job_that_fits_no_node_yet_starts_on_the_node_being_added():
    cluster, running = scene()
    queued = [QueuedJob("c", "acme", "pro", 8, NOW - 50, 3600, gpu_models=("L4",))]
    plan = forecast(NOW, cluster, queued, running, default_tiers(),
                    end_of=lambda job: job.est_end, runtime_of=lambda job: 300,
                    arriving=[ArrivingNode(NOW + 40, "L4", 8)])  # fmt: skip
    assert plan.starts == {"c": NOW + 40} and plan.on_new_node == {"c": NOW + 40}


def test_the_forecast_stops_at_its_bounds():
    cluster, running = scene()
    queued = [QueuedJob(f"q{i}", "acme", "pro", 8, NOW + i, 3600) for i in range(10)]
    plan = forecast(NOW, cluster, queued, running, default_tiers(), max_events=3,
                    end_of=lambda job: job.est_end, runtime_of=lambda job: 60)  # fmt: skip
    assert plan.cut and len(plan.starts) < 10


def test_copy_and_quantile():
    cluster, _ = scene(nodes=2)
    cluster.cordon("n1")
    copy = copy_cluster(cluster)
    assert copy.node_view("n1").cordoned and copy.placement_of("busy") is not None
    assert quantile([1.0, 2.0, 3.0, 4.0, 5.0], 0.5) == 3.0 and quantile([7.0], 0.9) == 7.0
