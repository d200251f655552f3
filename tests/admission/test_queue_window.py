"""The queue window each submit's answer reads (apps/admission/rows.py `queue_window`): the jobs
queued since a moment that earlier windows did not return, and the queue's length. On
PostgreSQL the statement leaves the returned ones out (they were read, converted and dropped)."""

from datetime import timedelta

import pytest
from django.db import connection
from django.utils import timezone

from apps.admission import rows
from apps.jobs.models import Job


@pytest.fixture
def submit(as_user):
    client = as_user("bob")

    def one() -> Job:
        answer = client.post("/api/v1/jobs/", {"command": ["true"], "gpus": 1}, format="json")
        assert answer.status_code == 201, answer.content
        return Job.objects.get(pk=answer.json()["id"])

    return one


@pytest.fixture
def fetched(monkeypatch):
    """The rows each statement of rows.py gave back, counted (the window's total row included)."""
    counts = []
    own = rows._all

    def counted(*args, **kwargs):
        found = own(*args, **kwargs)
        counts.append(len(found))
        return found

    monkeypatch.setattr(rows, "_all", counted)
    return counts


def test_a_window_returns_only_what_the_last_ones_did_not(cast, submit, fetched):
    first = [submit() for _ in range(3)]
    since = min(j.created_at for j in first) - timedelta(seconds=1)
    found, total, seen = rows.queue_window(since)
    assert [row[0] for row in found] == [j.pk for j in first] and total == 3
    assert [row[8] for row in found] == [j.created_at for j in first]  # aware, as the ORM's
    later = [submit() for _ in range(2)]
    fetched.clear()
    found, total, seen = rows.queue_window(since, seen)
    assert [row[0] for row in found] == [j.pk for j in later] and total == 5
    # PostgreSQL: the three already returned are not read again; SQLite reads and drops them.
    assert fetched == ([2 + 1] if connection.vendor == "postgresql" else [5 + 1])
    Job.objects.filter(pk=first[0].pk).update(state="cancelled")
    found, total, seen = rows.queue_window(since, seen)
    assert found == [] and total == 4  # a job that left: seen in the total (estimates reloads)
    assert rows.queue_window(since, seen)[0] == []


def test_a_window_keeps_the_returned_jobs_only_while_they_are_in_it(cast, submit):
    jobs = [submit() for _ in range(2)]
    since = jobs[0].created_at - timedelta(seconds=1)
    _, _, seen = rows.queue_window(since)
    assert len(seen) == 2
    _, _, seen = rows.queue_window(jobs[1].created_at, seen)
    assert len(seen) == 1  # the older one can be in no window from here on
    new = submit()
    found, total, _ = rows.queue_window(timezone.now() - timedelta(seconds=5), seen)
    assert [row[0] for row in found] == [jobs[0].pk, new.pk]  # no longer left out
    assert total == 3
