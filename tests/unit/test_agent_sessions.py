"""The agent API's session-activity endpoint (`members/<attempt>/<rank>/activity/`), through the
agent's own call (workers/sessions.py): how long the attempt's sessions were quiet on any rank,
for its placed node's live member only."""

import time

import pytest

from apps.nodes.credentials import issue_credential
from apps.platform import session_activity
from apps.platform.redis import shared_client
from tests.agent_http import agent_api
from tests.factories import make_cast, make_node
from tests.unit.test_agent_api import bearer, fenced, member_url
from tests.unit.test_dispatcher import placed_and_started
from workers import sessions
from workers.agent_client import ApiError
from workers.runner import Run


class Agent:
    def __init__(self, api):
        self.api = api


@pytest.fixture
def placed(db, tmp_path):
    make_node("h1", gpus=1)
    make_node("h2", gpus=1)
    _, attempt = placed_and_started(make_cast())
    shared_client().delete(session_activity.key(attempt.pk))
    api = agent_api(issue_credential(node_name="h1")[1])
    run = Run(assignment=api.assignment(attempt.pk, 0, str(attempt.token)), workdir=tmp_path,
              log_path=tmp_path / "log")  # fmt: skip
    yield attempt, sessions.Sessions(Agent(api)), run  # type: ignore[arg-type]
    shared_client().delete(session_activity.key(attempt.pk))


def test_rank_0_learns_how_long_every_ranks_sessions_were_quiet(placed):
    attempt, tracker, run = placed
    assert tracker.platform_quiet_for(run) is None  # no session ever carried a byte
    shared_client().set(session_activity.key(attempt.pk), repr(time.time() - 30))
    assert 29 <= tracker.platform_quiet_for(run) < 40


def test_only_the_placed_nodes_member_with_its_token_is_told(placed):
    attempt, _, run = placed
    shared_client().set(session_activity.key(attempt.pk), repr(time.time()))
    other = bearer(issue_credential(node_name="h2")[1])
    assert other.get(member_url(attempt, "activity/"), **fenced(attempt)).status_code == 404
    mine = bearer(issue_credential(node_name="h1")[1])
    wrong = "00000000-0000-0000-0000-000000000000"
    assert mine.get(member_url(attempt, "activity/"), **fenced(attempt, wrong)).status_code == 404
    assert mine.get(member_url(attempt, "activity/"), **fenced(attempt)).status_code == 200


def test_an_ended_member_is_not_told_and_its_agent_does_not_end_the_job(placed):
    attempt, tracker, run = placed
    attempt.members.update(ended_at=attempt.started_at or attempt.created_at)
    with pytest.raises(ApiError, match="404"):
        tracker.platform_quiet_for(run)
    assert tracker.busy_elsewhere(run, time.monotonic(), 60)
