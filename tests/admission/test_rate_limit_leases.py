"""Each process's leases of the shared submit buckets (apps/admission/leases.py): spent without a
Redis round trip, given back within LEASE_SECONDS, never beyond the shared buckets."""

import threading
import time

import pytest

from apps.admission import buckets, leases
from apps.tenants.models import Tenant
from apps.tenants.services import quota_set
from tests.admission.conftest import TRAIN


@pytest.fixture
def redis_calls(monkeypatch):
    calls = []
    run = buckets._run

    def counted(*args, **kwargs):
        calls.append(kwargs)
        return run(*args, **kwargs)

    monkeypatch.setattr(buckets, "_run", counted)
    return calls


def limit(*, rate: int, burst: int) -> None:
    quota_set(
        tenant=Tenant.objects.get(slug="acme"), submit_rate_per_minute=rate, submit_burst=burst
    )


def test_a_process_spends_its_lease_without_asking_redis(as_user, settings, redis_calls):
    settings.USER_SUBMIT_SHARE = 1
    limit(rate=6000, burst=100)  # 100/s: a lease of 100
    codes = [
        as_user("bob").post("/api/v1/jobs/", TRAIN, format="json").status_code for _ in range(10)
    ]
    assert codes == [201] * 10
    assert len(redis_calls) == 1


def test_a_refusal_is_remembered_until_its_retry_after(as_user, settings, redis_calls):
    settings.USER_SUBMIT_SHARE = 1
    limit(rate=30, burst=1)  # one token every 2 s
    bob = as_user("bob")
    answers = [bob.post("/api/v1/jobs/", TRAIN, format="json") for _ in range(4)]
    assert [a.status_code for a in answers] == [201, 429, 429, 429]
    assert all(a["Retry-After"] == "2" for a in answers[1:])
    assert len(redis_calls) == 1  # the lease; Redis said then when a token would come


def test_unspent_tokens_go_back_to_the_shared_buckets(cast):
    big = [buckets.Bucket(f"{buckets.PREFIX}test:big", rate_per_minute=600, burst=10)]
    process = leases.Leases()
    assert process.take(big).taken == 1  # a lease of 1 s of refill, 10 tokens: one spent
    assert buckets.peek(big).states[0].remaining == 0 and process.unspent(big) == 9
    for lease in process.held.values():
        lease.taken_at -= leases.lease_seconds()  # as if a second had gone by, without the refill
    process.give_back_stale()
    assert buckets.peek(big).states[0].remaining == 9
    assert process.unspent(big) == 0


def test_two_processes_together_admit_no_more_than_the_shared_bucket(cast):
    """Two processes' leases, taken in turn as fast as they go: together they never pass the
    burst plus the refill of the time they took (docs/admission.md, "Rate limits")."""
    wanted = [buckets.Bucket(f"{buckets.PREFIX}test:two", rate_per_minute=600, burst=20)]
    first, second = leases.Leases(), leases.Leases()
    started = time.monotonic()
    admitted = 0
    while time.monotonic() - started < 2.5:
        for process in (first, second):
            admitted += process.take(wanted).taken
    elapsed = time.monotonic() - started
    assert admitted <= 20 + 10 * elapsed
    assert admitted >= 20  # the burst at least: leases admit, they do not only refuse


def test_a_lease_period_of_0_takes_every_token_from_redis(as_user, settings, redis_calls):
    settings.USER_SUBMIT_SHARE = 1
    settings.RATE_LIMIT_LEASE_SECONDS = 0
    limit(rate=6000, burst=100)
    codes = [
        as_user("bob").post("/api/v1/jobs/", TRAIN, format="json").status_code for _ in range(5)
    ]
    assert codes == [201] * 5
    assert [call["want"] for call in redis_calls] == [1] * 5


def test_threads_that_find_the_lease_spent_together_share_the_next(cast, monkeypatch):
    """Eight threads of one process find no lease at once (a burst's first submits, or the lease
    just spent): one takes the next lease and the others spend from it. When each took its own,
    two leases of 10 emptied this bucket of 20 and six threads answered 429 while their process
    held 18 unspent tokens."""
    wanted = [buckets.Bucket(f"{buckets.PREFIX}test:burst", rate_per_minute=600, burst=20)]
    process = leases.Leases()
    lease, calls = buckets.lease, []

    def slow_lease(*args, **kwargs):  # Redis's answer takes a while: every thread arrives first
        calls.append(kwargs)
        time.sleep(0.2)
        return lease(*args, **kwargs)

    monkeypatch.setattr(buckets, "lease", slow_lease)
    start, taken = threading.Barrier(8), []

    def submit():
        start.wait()
        taken.append(process.take(wanted).taken)

    threads = [threading.Thread(target=submit) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert taken == [1] * 8
    assert len(calls) == 1 and process.unspent(wanted) == 10 - 8
