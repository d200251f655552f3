"""The agent's Celery worker starts as root without Celery's "running as root" SecurityWarning:
it runs as root on purpose, to fence jobs (workers/celery_app.py `quiet_root_warning`), and takes
JSON only. Other warnings, and other workers' root warning, are untouched."""

import os
import warnings

from celery import Celery
from celery.exceptions import SecurityWarning

BROKER = "redis://127.0.0.1:1/0"  # never reached: a worker connects when it starts, not when made


def agent_worker(app):
    from workers import celery_app

    return app.Worker(hostname="agent@n1", queues=["node.n1"], pool="threads", concurrency=1,
                      loglevel="INFO", task_events=False, **celery_app.WORKER_OPTIONS)  # fmt: skip


def as_root(monkeypatch) -> None:
    monkeypatch.setattr(os, "getuid", lambda: 0)
    monkeypatch.setattr(os, "geteuid", lambda: 0)


def test_the_agents_worker_says_nothing_of_running_as_root(monkeypatch):
    from workers import celery_app

    as_root(monkeypatch)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        app = celery_app.configure(broker_url=BROKER, node="n1", visibility_timeout=60)
        agent_worker(app)
    assert [w for w in caught if issubclass(w.category, SecurityWarning)] == []
    assert list(app.conf.accept_content) == ["json"]


def test_another_worker_as_root_is_still_warned(monkeypatch):
    as_root(monkeypatch)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        other = Celery("other", set_as_current=False, broker=BROKER)
        other.Worker(hostname="other@n1", pool="threads", concurrency=1)
    assert any(issubclass(w.category, SecurityWarning) for w in caught)
