"""The dispatcher reads the cluster and the queue one after the other; jobs move in between."""

import pytest

from apps.jobs import services
from apps.scheduling import dispatcher
from tests.factories import make_cast, make_node
from tests.unit.test_dispatcher import submit


@pytest.fixture
def cast(db):
    return make_cast()


def test_a_job_requeued_while_the_pass_reads_the_cluster_is_left_for_the_next_pass(
    cast, monkeypatch, settings
):
    settings.RETRY_BACKOFF_SECONDS = 0
    make_node("h1", gpus=2)
    job = submit(cast, gpus=2)
    assert dispatcher.dispatch_once().placed == [str(job.id)]
    read_cluster = dispatcher.cluster_state

    def read_cluster_then_lose_the_job(*args, **kwargs):
        snapshot = read_cluster(*args, **kwargs)  # the job still runs here...
        services.attempt_lost(
            attempt=job.attempts.get(), reason="node h1 lost", actor="test"
        )  # ...queued here
        return snapshot

    monkeypatch.setattr(dispatcher, "cluster_state", read_cluster_then_lose_the_job)
    assert dispatcher.dispatch_once().placed == []  # no crash: "job ... is already known"
    monkeypatch.undo()
    assert dispatcher.dispatch_once().placed == [str(job.id)]
