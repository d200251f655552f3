"""The agent's reporter holds a start or an end a few milliseconds while reports are flowing, so
that a drain's calls carry several (workers/reporter.py ReportBatcher, GPUPLATFORM_REPORT_COALESCE_MS);
a report on a quiet node, or one that is waited for, goes at once; none is lost or reordered."""

from __future__ import annotations

import random
import threading
import time

from tests.unit.test_runner import Work
from workers.agent_client import ApiError
from workers.reporter import ReportBatcher


class Api:
    """Answers at once (or after `delay`), recording each call's items and when it came."""

    def __init__(self, delay: float = 0.0):
        self.delay = delay
        self.calls: list[tuple[float, list[dict]]] = []
        self.lock = threading.Lock()

    def reports(self, items):
        with self.lock:
            self.calls.append((time.monotonic(), items))
        time.sleep(self.delay)
        return [{"status": 200, "accepted": True} for _ in items]

    def batches(self) -> list[list[tuple[int, str]]]:
        return [[(i["attempt_id"], i["kind"]) for i in items] for _, items in self.calls]


class Answers:
    def __init__(self):
        self.got: dict[tuple[int, str], tuple] = {}
        self.at: dict[tuple[int, str], float] = {}
        self.lock = threading.Lock()

    def done(self, attempt_id: int, kind: str):
        def done(accepted, error):
            with self.lock:
                assert (attempt_id, kind) not in self.got, "answered twice"
                self.got[(attempt_id, kind)] = (accepted, error)
                self.at[(attempt_id, kind)] = time.monotonic()

        return done

    def wait(self, count: int, timeout: float = 10) -> None:
        deadline = time.monotonic() + timeout
        while len(self.got) < count and time.monotonic() < deadline:
            time.sleep(0.005)
        assert len(self.got) == count


def work(attempt_id: int) -> Work:
    return Work(argv=["true"], attempt_id=attempt_id)


def submit(batcher: ReportBatcher, answers: Answers, attempt_id: int, kind: str = "started"):
    batcher.submit(work(attempt_id), kind, {"pid": attempt_id}, answers.done(attempt_id, kind))
    return time.monotonic()


def test_a_report_on_a_quiet_node_goes_at_once_even_with_a_long_window():
    api, answers = Api(), Answers()
    batcher = ReportBatcher(api, coalesce=5.0)
    made = submit(batcher, answers, 1)
    answers.wait(1, timeout=2)
    assert answers.at[(1, "started")] - made < 1.0
    assert api.batches() == [[(1, "started")]]


def test_reports_made_while_reports_flow_are_held_for_the_window_and_go_together():
    api, answers = Api(), Answers()
    batcher = ReportBatcher(api, coalesce=0.3, quiet=5.0)
    submit(batcher, answers, 1)
    answers.wait(1)  # the first went alone, at once
    made = submit(batcher, answers, 2)  # reports are flowing: held for company
    time.sleep(0.05)
    submit(batcher, answers, 3, "finished")
    answers.wait(3)
    assert api.batches() == [[(1, "started")], [(2, "started"), (3, "finished")]]
    sent = api.calls[1][0] - made
    assert 0.25 <= sent < 1.5  # held about the window, never much longer


def test_without_a_window_a_report_goes_as_soon_as_no_call_is_in_flight():
    api, answers = Api(), Answers()
    batcher = ReportBatcher(api, coalesce=0.0, quiet=5.0)
    submit(batcher, answers, 1)
    answers.wait(1)
    made = submit(batcher, answers, 2)
    answers.wait(2)
    assert api.calls[1][0] - made < 0.5
    assert api.batches() == [[(1, "started")], [(2, "started")]]


def test_a_full_call_goes_before_the_window_ends():
    api, answers = Api(), Answers()
    batcher = ReportBatcher(api, coalesce=5.0, quiet=5.0, max_items=3)
    submit(batcher, answers, 1)
    answers.wait(1)
    began = time.monotonic()
    for attempt_id in (2, 3, 4):
        submit(batcher, answers, attempt_id)
    answers.wait(4, timeout=3)
    assert time.monotonic() - began < 2.0
    assert api.batches() == [[(1, "started")], [(2, "started"), (3, "started"), (4, "started")]]


def test_a_waited_report_goes_at_once_taking_the_held_ones_along_first():
    api, answers = Api(), Answers()
    batcher = ReportBatcher(api, coalesce=5.0, quiet=5.0)
    submit(batcher, answers, 1)
    answers.wait(1)
    submit(batcher, answers, 2)  # held
    began = time.monotonic()
    assert batcher.call(work(2), "progress", progress=0.5) is True
    assert time.monotonic() - began < 2.0
    answers.wait(2)
    assert api.batches() == [[(1, "started")], [(2, "started"), (2, "progress")]]


def test_reports_queued_behind_a_call_in_flight_are_not_held_again():
    api, answers = Api(delay=0.3), Answers()
    batcher = ReportBatcher(api, coalesce=5.0, quiet=5.0)
    submit(batcher, answers, 1)  # quiet: goes at once, answered in 0.3 s
    time.sleep(0.05)
    submit(batcher, answers, 2, "finished")  # waits for the call in flight, then goes at once
    answers.wait(2, timeout=3)
    assert api.batches() == [[(1, "started")], [(2, "finished")]]


def test_a_start_behind_a_call_in_flight_waits_for_its_own_end_and_goes_with_it():
    """A drain's quick job: its start queued behind a call in flight does not go alone when
    that call is answered, but with its end (one write of each row on the platform)."""
    api, answers = Api(delay=0.2), Answers()
    batcher = ReportBatcher(api, coalesce=2.0, quiet=5.0)
    submit(batcher, answers, 1)  # quiet: goes at once, answered in 0.2 s
    time.sleep(0.05)
    submit(batcher, answers, 2)  # behind the call in flight; reports flow
    time.sleep(0.35)  # the call in flight was answered meanwhile: the start still waits
    made = submit(batcher, answers, 2, "finished")
    answers.wait(3, timeout=5)
    assert api.batches() == [[(1, "started")], [(2, "started"), (2, "finished")]]
    assert answers.at[(2, "finished")] - made < 1.0  # its end came: both went at once


def test_a_start_waiting_for_its_end_goes_alone_once_it_is_a_window_old():
    api, answers = Api(delay=0.1), Answers()
    batcher = ReportBatcher(api, coalesce=0.4, quiet=5.0)
    submit(batcher, answers, 1)  # quiet: goes at once, answered in 0.1 s
    time.sleep(0.02)
    made = submit(batcher, answers, 2)  # a job that runs on: no end comes
    answers.wait(2, timeout=5)
    waited = answers.at[(2, "started")] - made
    assert 0.35 < waited < 2.0, waited  # not at the call's answer (0.08 s), not forever
    assert api.batches() == [[(1, "started")], [(2, "started")]]


def test_many_members_reports_from_several_threads_are_all_answered_once_in_order():
    api, answers = Api(delay=0.002), Answers()
    batcher = ReportBatcher(api, coalesce=0.01, quiet=5.0, max_items=8)

    def member_reports(first: int) -> None:
        for attempt_id in range(first, first + 25):
            submit(batcher, answers, attempt_id, "started")
            time.sleep(random.random() * 0.004)
            submit(batcher, answers, attempt_id, "finished")

    threads = [threading.Thread(target=member_reports, args=(i * 100,)) for i in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    answers.wait(200)
    flat = [entry for batch in api.batches() for entry in batch]
    assert len(flat) == 200 and len(set(flat)) == 200  # each sent once
    for attempt_id, kind in flat:
        if kind == "started":
            assert flat.index((attempt_id, "started")) < flat.index((attempt_id, "finished"))
    assert all(len(batch) <= 8 for batch in api.batches())
    assert len(api.calls) < 150  # several a call


def test_held_reports_still_go_one_by_one_to_a_control_plane_without_the_batch_endpoint():
    class Old:
        def __init__(self):
            self.single: list[tuple[int, str]] = []

        def reports(self, items):
            raise ApiError("POST /reports/: 404 not found", 404)

        def report(self, assignment, kind, **body):
            self.single.append((assignment.attempt_id, kind))
            return True

    api, answers = Old(), Answers()
    batcher = ReportBatcher(api, coalesce=0.05, quiet=5.0)
    submit(batcher, answers, 1)
    answers.wait(1)
    submit(batcher, answers, 2)
    submit(batcher, answers, 2, "finished")
    answers.wait(3)
    assert api.single == [(1, "started"), (2, "started"), (2, "finished")] and batcher.single


# --- the runner: a quick job's end follows its start, unanswered, into the same call ------------


def test_a_quick_jobs_end_goes_in_the_same_call_as_its_held_start(tmp_path):
    """With a reporter that keeps a member's reports in order, the runner reports an end whose
    start is still queued: a `true` job's start and end travel in one call, start first."""
    from tests.unit.test_runner import Recorder, py
    from workers.runner import Runner

    api, answers = Api(), Answers()

    class InOrder(Recorder):
        reports_in_order = True

        def __init__(self):
            super().__init__()
            self.batcher = ReportBatcher(api, coalesce=1.0, quiet=60.0)

        def started_later(self, run, done):
            self.batcher.submit(run.assignment, "started", {"pid": run.process.pid}, done)

        def finished_later(self, run, exit_code, reason, checkpoint, done):
            self.batcher.submit(run.assignment, "finished", {"exit_code": exit_code}, done)

    reporter = InOrder()
    submit(reporter.batcher, answers, 99)  # reports are flowing: the next start is held
    answers.wait(1)
    runner = Runner(node="n1", data_dir=tmp_path, reporter=reporter, kill_grace=1.0)
    runner.launch(Work(argv=py("pass"), attempt_id=1))
    deadline = time.monotonic() + 10
    while runner.runs and time.monotonic() < deadline:
        runner.tick()
        time.sleep(0.02)
    assert runner.runs == {}
    assert api.batches() == [[(99, "started")], [(1, "started"), (1, "finished")]]


def test_only_a_gangs_rank_0_reports_its_master_port(tmp_path):
    """A one-member job's start carries no MASTER_PORT (nobody waits for it), so the platform
    can apply it with other starts or with its own end in one write; a gang's rank 0 sends it."""
    from workers.reporter import _started_body
    from workers.run import Run

    alone = Run(assignment=Work(argv=["true"], attempt_id=1), workdir=tmp_path,
                log_path=tmp_path / "1.log", master_port=29777)  # fmt: skip
    assert _started_body(alone) == {"pid": 0}
    leader = Run(assignment=Work(argv=["true"], attempt_id=2, world_size=2), workdir=tmp_path,
                 log_path=tmp_path / "2.log", master_port=29777)  # fmt: skip
    assert _started_body(leader) == {"pid": 0, "master_port": 29777}


def test_the_window_is_30_ms_unless_the_agent_is_told_otherwise():
    # 10 ms left most of a busy drain's quick jobs with their start and end in two calls.
    import os

    from workers import reporter

    if "GPUPLATFORM_REPORT_COALESCE_MS" not in os.environ:
        assert reporter.COALESCE_MS == 30
        assert ReportBatcher(None).coalesce == 0.03  # type: ignore[arg-type]
