"""The runner when its reports to the platform fail or come back refused."""

import time

from tests.processes import alive
from tests.unit.test_runner import Recorder, Work, py, run_until_finished
from workers.runner import Runner


class RefusingStart(Recorder):
    """The platform says the attempt ended before this process started (lost meanwhile)."""

    def started(self, run):
        super().started(run)
        return False


class FailingStart(Recorder):
    """The database is not answering when the process starts."""

    def started(self, run):
        super().started(run)
        raise RuntimeError("database is locked")


def test_a_process_whose_attempt_ended_before_it_started_is_stopped_at_once(tmp_path):
    runner = Runner(node="n1", data_dir=tmp_path, reporter=RefusingStart(), kill_grace=1.0)
    started = time.monotonic()
    runner.launch(Work(argv=py("import time; time.sleep(60)")))
    pid = runner.runs[(1, 0)].process.pid
    finished = run_until_finished(runner)
    assert finished[2] == "not assigned here any more"
    assert time.monotonic() - started < 10 and not alive(pid)


def test_a_failed_start_report_never_reports_a_running_process_finished(tmp_path):
    runner = Runner(node="n1", data_dir=tmp_path, reporter=FailingStart(), kill_grace=1.0)
    runner.launch(Work(argv=py("import time; time.sleep(1)")))
    pid = runner.runs[(1, 0)].process.pid
    finished = run_until_finished(runner)
    assert finished == ("finished", 0, "")  # its real end, not a made-up launch failure
    assert not alive(pid)
