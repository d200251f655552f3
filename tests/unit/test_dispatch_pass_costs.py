"""What a dispatcher pass builds once, not once per queued job: the placement strategy's request
mix (one pod per job shape) and the nodes' shapes behind the "only a lost node could run it"
words (read once a pass, each job shape's answer worked out once)."""

from types import SimpleNamespace

import pytest

from apps.admission import fit
from apps.jobs.models import Job
from apps.nodes.models import Node, NodeState
from apps.scheduling import core, plan
from apps.scheduling.dispatcher import dispatch_once, placement_strategy
from tests.factories import make_cast, make_node
from tests.unit.test_dispatcher import submit


def test_the_request_mix_counts_each_job_once_by_its_shape():
    jobs = [SimpleNamespace(pk=i, gpus=gpus, nodes=nodes)
            for i, (gpus, nodes) in enumerate([(1, 1)] * 5 + [(4, 2)] * 2 + [(8, 1)])]  # fmt: skip
    one_pod_a_job = [core.Pod(name=str(job.pk), gpus=job.gpus, nodes=job.nodes) for job in jobs]
    strategy = placement_strategy(jobs)
    assert isinstance(strategy, core.FGDPlus)
    assert strategy.workload == core.Workload.from_pods(one_pod_a_job)


@pytest.fixture
def shapes_forgotten():
    """The nodes' shapes are kept for a while (fit.shapes), the plan per process: both afresh
    here, and after."""
    fit.forget(), plan.forget()
    yield
    fit.forget(), plan.forget()


def test_jobs_only_lost_nodes_could_run_are_worded_from_one_read_of_the_shapes(
    db, monkeypatch, shapes_forgotten
):
    cast = make_cast()
    make_node("h1", gpus=4)
    Node.objects.update(state=NodeState.LOST)
    jobs = [submit(cast, gpus=1) for _ in range(6)] + [submit(cast, gpus=2)]
    reads = []
    shapes = fit.shapes

    def counted(*args, **kwargs):
        reads.append(1)
        return shapes(*args, **kwargs)

    monkeypatch.setattr(fit, "shapes", counted)
    dispatch_once()
    assert len(reads) == 1
    for job in Job.objects.filter(pk__in=[job.pk for job in jobs]):
        assert job.reason.startswith("only a lost node could run it"), job.reason
