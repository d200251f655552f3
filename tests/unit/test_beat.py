"""The beat's scheduler sleeps until an entry is due, where Celery's spun for its last 10 ms."""

from celery.beat import PersistentScheduler

from gpuplatform.beat import Scheduler
from gpuplatform.celery import app


def test_the_dispatchers_beat_uses_it():
    assert app.conf.beat_scheduler == "gpuplatform.beat:Scheduler"


def test_it_sleeps_a_wait_shorter_than_celerys_drift(tmp_path):
    stock = PersistentScheduler(app=app, schedule_filename=str(tmp_path / "a"), lazy=True)
    ours = Scheduler(app=app, schedule_filename=str(tmp_path / "b"), lazy=True)
    assert not stock.adjust(0.004) > 0  # Celery's: no sleep, the loop ticks again at once
    assert ours.adjust(0.004) == 0.004


def test_it_keeps_celerys_waits_otherwise(tmp_path):
    ours = Scheduler(app=app, schedule_filename=str(tmp_path / "b"), lazy=True)
    stock = PersistentScheduler(app=app, schedule_filename=str(tmp_path / "a"), lazy=True)
    for wait in (0.5, 0.02, 0, -1, None):
        assert ours.adjust(wait) == stock.adjust(wait)
