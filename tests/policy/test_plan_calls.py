"""How often the dispatcher asks for the start plan (apps/scheduling/dispatcher.py
`_plan_wanted`): every pass, except right after a pass that placed jobs (a drain), when it waits
PLAN_WHILE_PLACING_S since the last plan. plan.py's own limits decide the rest."""

import pytest

from apps.admission import estimates
from apps.scheduling import plan
from apps.scheduling.dispatcher import dispatch_once
from tests.admission.conftest import TRAIN, cast  # noqa: F401 (fixtures)
from tests.factories import client_for


@pytest.fixture
def calls(cast, monkeypatch):  # noqa: F811
    plan.forget()
    estimates.forget()
    made = []
    real = plan.Planner.make

    def counted(self, *args, **kwargs):
        made.append(1)
        return real(self, *args, **kwargs)

    monkeypatch.setattr(plan.Planner, "make", counted)
    yield client_for(cast["bob"][1]), made
    plan.forget()


def test_no_plan_right_after_a_pass_that_placed_and_one_after_a_pass_that_did_not(calls):
    bob, made = calls
    for _ in range(2):
        assert bob.post("/api/v1/jobs/", {**TRAIN, "gpus": 8}, format="json").status_code == 201
    assert dispatch_once().placed and len(made) == 1  # one 8-GPU node: one placed, one waits
    assert not dispatch_once().placed and len(made) == 1  # after a pass that placed: none
    dispatch_once()
    assert len(made) == 2  # after a pass that placed nothing: asked again
