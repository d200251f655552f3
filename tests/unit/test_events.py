"""The event bus (apps/platform/events.py): after-commit handlers run once the transaction
commits and never for one rolled back, a failing handler is logged and the others still run;
in-transaction handlers run at once, in the emitter's transaction. And the apps subscribe
what the layers rely on."""

import logging
import subprocess
import sys
from dataclasses import dataclass

import pytest
from django.db import transaction

from apps.admission import cache
from apps.jobs import handlers as job_handlers
from apps.platform import events
from apps.scheduling import handlers as scheduling_handlers


@dataclass(frozen=True)
class Happened:
    what: str = "it"


class Seen(list):
    """The events a test's handlers saw; `on` subscribes a handler for the test's length."""

    def __init__(self):
        super().__init__()
        self.subscribed = []

    def on(self, handler, **kind) -> None:
        events.subscribe(Happened, handler, **kind)
        self.subscribed.append(handler)


@pytest.fixture
def seen():
    calls = Seen()
    yield calls
    for handler in calls.subscribed:
        events.unsubscribe(Happened, handler)


def test_an_after_commit_handler_runs_once_the_transaction_commits(
    db, seen, django_capture_on_commit_callbacks
):
    seen.on(seen.append)
    with django_capture_on_commit_callbacks(execute=True):
        with transaction.atomic():
            events.emit(Happened("submitted"))
            assert seen == []  # not yet: the transaction is open
    assert seen == [Happened("submitted")]


def test_an_after_commit_handler_never_runs_for_a_rolled_back_transaction(
    db, seen, django_capture_on_commit_callbacks
):
    seen.on(seen.append)
    with django_capture_on_commit_callbacks(execute=True) as callbacks:
        with pytest.raises(RuntimeError):
            with transaction.atomic():
                events.emit(Happened())
                raise RuntimeError("refused")
    assert callbacks == [] and seen == []


def test_coalesced_equal_events_are_delivered_once_others_as_ever_and_none_if_it_raises(
    db, seen, django_capture_on_commit_callbacks
):
    seen.on(seen.append)
    with django_capture_on_commit_callbacks(execute=True):
        with transaction.atomic(), events.coalesced(Happened):
            for what in ("end", "end", "start", "end"):
                events.emit(Happened(what))
            assert seen == []  # not yet: the transaction is open
    assert seen == [Happened("end"), Happened("start")]
    seen.clear()
    with django_capture_on_commit_callbacks(execute=True) as callbacks:
        with pytest.raises(RuntimeError), transaction.atomic(), events.coalesced(Happened):
            events.emit(Happened())
            raise RuntimeError("refused")
    assert callbacks == [] and seen == []
    with django_capture_on_commit_callbacks(execute=True):
        with transaction.atomic():  # after the block: as ever, each on its own
            events.emit(Happened())
            events.emit(Happened())
    assert seen == [Happened(), Happened()]


def test_outside_a_transaction_an_event_is_delivered_at_once(transactional_db, seen):
    seen.on(seen.append)
    events.emit(Happened("now"))
    assert seen == [Happened("now")]


def test_a_failing_handler_is_logged_and_the_others_still_run(seen, caplog):
    def broken(event):
        raise ConnectionError("broker down")

    seen.on(broken)
    seen.on(seen.append)
    with caplog.at_level(logging.ERROR, logger="apps.platform.events"):
        events.deliver(Happened())
    assert seen == [Happened()]
    assert "the reconcile tick repairs" in caplog.text and "broker down" in caplog.text


def test_an_in_transaction_handler_runs_at_once_and_answers(db, seen):
    seen.on(lambda event: seen.append(event) or ["job-1"], in_transaction=True)
    with transaction.atomic():
        assert events.emit(Happened()) == [["job-1"]]
        assert seen == [Happened()]


def test_an_in_transaction_handler_that_fails_fails_the_change(db, seen):
    def refuses(event):
        raise ValueError("no")

    seen.on(refuses, in_transaction=True)
    with pytest.raises(ValueError):
        events.emit(Happened())


def test_subscribing_twice_keeps_one_handler(seen):
    seen.on(seen.append)
    seen.on(seen.append)
    events.deliver(Happened())
    assert seen == [Happened()]


def test_the_apps_subscribe_what_the_layers_rely_on():
    assert cache.on_job_ended in events.handlers_of(events.JobEnded)["in_transaction"]
    assert (
        scheduling_handlers.request_dispatch
        in events.handlers_of(events.DispatchWanted)["after_commit"]
    )
    assert (
        scheduling_handlers.publish_start
        in events.handlers_of(events.AttemptPlaced)["after_commit"]
    )
    assert (
        scheduling_handlers.publish_stop in events.handlers_of(events.StopRequested)["after_commit"]
    )
    for event_type, handler in [(events.NodeAlive, job_handlers.renew_leases),
                                (events.NodeLost, job_handlers.lose_attempts_on_node),
                                (events.DrainOverdue, job_handlers.preempt_on_drained_nodes)]:  # fmt: skip
        assert handler in events.handlers_of(event_type)["in_transaction"]


def test_names_and_errors_import_without_django():
    # The node agent imports them and runs no Django.
    code = "import sys, apps.platform.names, apps.platform.errors; print('django' in sys.modules)"
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    )
    assert result.stdout.strip() == "False"


def test_a_dispatch_wanted_reaches_the_scheduler_after_commit(
    db, monkeypatch, django_capture_on_commit_callbacks
):
    from apps.jobs.services import trigger_dispatch
    from apps.scheduling import tasks

    requests = []
    monkeypatch.setattr(
        tasks, "request_dispatch", lambda after_submit=False: requests.append("pass")
    )
    with django_capture_on_commit_callbacks(execute=True):
        with transaction.atomic():
            trigger_dispatch()
            assert requests == []
    assert requests == ["pass"]


def test_admissions_coalesced_request_is_delivered_at_once(monkeypatch):
    from apps.admission import dispatch
    from apps.scheduling import tasks

    requests = []
    monkeypatch.setattr(
        tasks, "request_dispatch", lambda after_submit=False: requests.append("pass")
    )
    dispatch._send()  # runs after the commits (or in the sender thread): no transaction to wait for
    assert requests == ["pass"]


def test_a_placement_and_a_cancel_reach_the_node_queue_after_commit(
    db, monkeypatch, django_capture_on_commit_callbacks
):
    from apps.jobs import services
    from apps.scheduling import publish, tasks
    from apps.scheduling.dispatcher import dispatch_once
    from tests.factories import make_cast, make_node
    from tests.unit.test_dispatcher import submit

    sent = []
    monkeypatch.setattr(
        publish,
        "_send",
        lambda task, queue, **kwargs: sent.append((task, queue, kwargs.get("why"))),
    )
    monkeypatch.setattr(tasks, "request_dispatch", lambda after_submit=False: None)
    cast = make_cast()
    make_node("h1", gpus=1)
    job = submit(cast, gpus=1)
    with django_capture_on_commit_callbacks(execute=True):
        with transaction.atomic():
            assert dispatch_once().placed == [str(job.pk)]
            assert sent == []  # nothing leaves before the placement commits
    assert sent == [("workers.start_attempt", "node.h1", None)]
    with django_capture_on_commit_callbacks(execute=True):
        services.job_cancel(job=job, actor="test")
    assert sent[1:] == [("workers.stop_attempt", "node.h1", "cancel")]
