"""The result cache's races found by the stress suite, each made to happen on purpose (issue 36):
one transaction is held open at the point that matters while the other runs into it. Both left
a follower queued for ever, joined to an origin that had ended."""

import threading
import time

import pytest
from django.db import connection, connections, transaction

from apps.admission.models import CachedJob, CacheRole
from apps.jobs.models import Job, JobAttempt, JobState
from apps.jobs.services import job_cancel, lock_reported_members, member_finished
from apps.scheduling.dispatcher import dispatch_once
from apps.tenants.models import Tenant
from apps.tenants.services import quota_set
from tests.concurrency.stress import ON_POSTGRESQL
from tests.factories import client_for, make_cast, make_node

pytestmark = [ON_POSTGRESQL, pytest.mark.django_db(transaction=True)]

INFER = {"template": "demo-infer", "params": {"prompt": "race", "max_tokens": 4}, "gpus": 1,
         "gpu_sku": "H100-80GB"}  # fmt: skip


@pytest.fixture
def bob():
    people = make_cast()
    make_node("h1", "H100-80GB", 8)
    quota_set(
        tenant=Tenant.objects.get(slug="acme"), submit_rate_per_minute=1000, submit_burst=1000
    )
    return client_for(people["bob"][1])


def submit(client) -> str:
    response = client.post("/api/v1/jobs/", INFER, format="json")
    assert response.status_code == 201, response.content
    return response.json()["id"]


def in_thread(work) -> threading.Thread:
    def run():
        try:
            work()
        finally:
            connections.close_all()

    thread = threading.Thread(target=run)
    thread.start()
    return thread


def held_open(change) -> tuple[threading.Thread, threading.Event]:
    """`change()` in a transaction kept open until the returned event is set."""
    done, release = threading.Event(), threading.Event()

    def work():
        with transaction.atomic():
            change()
            done.set()
            release.wait(20)

    thread = in_thread(work)
    assert done.wait(20)
    return thread, release


def wait_for_a_lock_wait() -> None:
    """Until a session of this database waits for a row lock."""
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT COUNT(*) FROM pg_stat_activity WHERE datname = current_database() "
                "AND wait_event_type = 'Lock'"
            )
            if cursor.fetchone()[0]:
                return
        time.sleep(0.02)
    raise AssertionError("no session waited for a lock")


def test_a_submit_joining_an_origin_that_ends_meanwhile_is_served_its_result(bob):
    origin = submit(bob)
    dispatch_once()
    attempt = JobAttempt.objects.get(job_id=origin)

    def origin_finishes():
        reported = lock_reported_members(attempt_ids=[attempt.pk])[(attempt.pk, 0)]
        member_finished(reported, exit_code=0)

    ender, release = held_open(origin_finishes)  # its end settled no follower: none yet
    made = []
    submitter = in_thread(lambda: made.append(submit(bob)))
    wait_for_a_lock_wait()  # it waits for the origin's row
    release.set()
    ender.join()
    submitter.join()

    job = Job.objects.get(pk=made[0])
    assert (job.state, job.cache_hit) == (JobState.SUCCEEDED, True)
    assert CachedJob.objects.get(job=job).role == CacheRole.HIT


def test_an_origin_cancelled_while_its_oldest_follower_is_hands_over_to_the_next(bob):
    origin = submit(bob)
    dispatch_once()
    first, second = submit(bob), submit(bob)
    follower_cancelled, release = held_open(
        lambda: job_cancel(job=Job.objects.get(pk=first), actor="user:bob")
    )
    canceller = in_thread(lambda: job_cancel(job=Job.objects.get(pk=origin), actor="user:bob"))
    wait_for_a_lock_wait()  # the origin's end waits for the follower's row
    release.set()
    follower_cancelled.join()
    canceller.join()

    assert Job.objects.get(pk=second).reason == f"took over from cancelled identical job {origin}"
    assert CachedJob.objects.get(job_id=first).role == CacheRole.FOLLOWER
    heir = CachedJob.objects.get(job_id=second)
    assert (heir.role, heir.active) == (CacheRole.ORIGIN, True)
