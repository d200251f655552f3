"""The agent API's session-activity endpoint (docs/interactive.md): `members/<attempt>/<rank>/
activity/`. An interactive gang's rank 0 ends the job when nothing was typed or printed for its
idle timeout, but a user may be at any rank's node: before it ends the job, its agent asks here
how long the attempt's sessions on every rank have been quiet (the relay records each byte's
time, apps/platform/session_activity.py). `{"quiet_seconds": N}`, null when no session of the
attempt ever carried a byte; 503 while Redis cannot say (the agent waits and asks again)."""

from __future__ import annotations

import logging

import redis
from rest_framework import status
from rest_framework.response import Response

from apps.nodes.agent_api import AgentView, _live
from apps.platform import session_activity

log = logging.getLogger(__name__)


class SessionActivityView(AgentView):
    def get(self, request, attempt_id: int, rank: int):
        member = _live(self.member(attempt_id, rank))
        try:
            quiet = session_activity.quiet_for(member.attempt_id)
        except redis.RedisError as error:
            log.warning("could not read the session activity of attempt %s (%s)", attempt_id, error)
            return Response(
                {"detail": "the session activity is unknown for now"},
                status=status.HTTP_503_SERVICE_UNAVAILABLE,
            )
        return Response({"quiet_seconds": quiet})
