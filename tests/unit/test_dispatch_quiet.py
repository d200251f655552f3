"""The pass after a futile one begins the submits' wait itself (apps/scheduling/tasks.py
QUIET_MS): submits made while it runs wait for one pass after it, not a second pass straight
after; if it places after all, those submits get a pass at once."""

from apps.scheduling import tasks
from apps.scheduling.dispatcher import DispatchResult
from apps.scheduling.redis import shared_client
from tests.unit import test_dispatch_request

sent = test_dispatch_request.sent  # the fixture: dispatch messages recorded, not sent


def passes_with_submits(sent, monkeypatch, *results: DispatchResult) -> list:
    """Each pass from here on: five submits commit while it runs, then it ends with the next of
    `results` (the last one repeats). Returns the list the passes are counted in."""
    ran: list = []

    def one_pass():
        if not ran:
            for _ in range(5):
                tasks.request_dispatch(after_submit=True)
        ran.append(1)
        return results[min(len(ran), len(results)) - 1]

    monkeypatch.setattr(tasks.dispatcher, "dispatch_once", one_pass)
    return ran


def after_a_futile_pass_whose_wait_is_over(sent) -> None:
    sent.passes.append(DispatchResult(free_gpus=0))
    tasks.dispatch()  # futile: the wait begins
    shared_client().delete(tasks.QUIET_KEY)  # and ends; the delayed pass comes
    sent.clear()


def test_submits_during_the_pass_after_a_futile_one_wait_for_one_pass_after_it(
    sent,
    monkeypatch,
):
    after_a_futile_pass_whose_wait_is_over(sent)
    ran = passes_with_submits(sent, monkeypatch, DispatchResult(free_gpus=0))
    tasks.dispatch()
    assert len(ran) == 1
    assert len(sent) == 1 and 0 < sent[0]["countdown"] <= tasks.QUIET_MS / 1000
    assert 0 < shared_client().pttl(tasks.QUIET_KEY) <= tasks.QUIET_MS


def test_if_that_pass_places_the_submits_it_made_wait_get_a_pass_at_once(
    sent,
    monkeypatch,
):
    after_a_futile_pass_whose_wait_is_over(sent)
    ran = passes_with_submits(
        sent, monkeypatch, DispatchResult(placed=["j"]), DispatchResult(free_gpus=1)
    )
    tasks.dispatch()
    assert len(ran) == 2  # the holder went again at once, not at the delayed message's time
    assert not shared_client().exists(tasks.QUIET_KEY, tasks.DIRTY_KEY)


def test_a_pass_after_one_that_was_not_futile_makes_no_submit_wait(sent, monkeypatch):
    sent.passes.append(DispatchResult(placed=["j"]))
    tasks.dispatch()
    sent.clear()
    ran = passes_with_submits(sent, monkeypatch, DispatchResult(free_gpus=0))
    tasks.dispatch()
    assert len(ran) == 1 and len(sent) == 1 and "countdown" not in sent[0]
