"""A plain submit's round trips to the database, every one of them counted (transaction control
too), as production runs it: no test transaction around the request, the token and the
submitter in this process's caches, the replay of the queue fresh. A body that names no
template or SKU (the bench's, a script's `command`).

PostgreSQL: two round trips. The admit statement (the count row's lock, the cap's check, the
job and its event, committed on its own: apps/admission/rows.py `admit`) and the queue window
for the answer's position and estimate (apps/admission/estimates.py `for_new_job`).
SQLite: BEGIN IMMEDIATE, the job (its insert checks the cap: rows.insert_if_room) and its event,
COMMIT, then the window (six until the cap was read by a statement of its own).
"""

import pytest
from django.db import connection

from tests.admission.test_submit_queries import warm_submits

PLAIN = {"command": ["true"], "gpus": 1}
ROUND_TRIPS = {"postgresql": 2, "sqlite": 5}


@pytest.mark.django_db(transaction=True)
def test_a_plain_submit_makes_exactly_its_round_trips():
    seen = [[q["sql"] for q in ctx.captured_queries] for ctx in warm_submits(PLAIN)]
    # The fewest of five: a replay older than REUSE_SECONDS (a slow machine) loads the queue again.
    fewest = min(seen, key=len)
    print("\n".join(s[:160] for s in fewest))
    assert len(fewest) == ROUND_TRIPS[connection.vendor], "\n".join(s[:160] for s in fewest)
