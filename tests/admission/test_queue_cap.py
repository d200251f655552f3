"""The queued-job cap counts a tenant's whole queue, its queued jobs and its arrays' virtual
tasks (not yet rows), whichever way a submit comes: a single job or an array, in a transaction
or in one round trip (PostgreSQL outside one), and while another submit is committing."""

import threading

import pytest
from django.db import connection, transaction

from apps.admission.submit import submit_job
from apps.jobs.models import Job, JobArray, JobState
from apps.platform.errors import QueueFull
from apps.tenants.models import Tenant
from apps.tenants.services import quota_set
from tests.admission.conftest import TRAIN, generous
from tests.factories import client_for, make_cast, make_node, park_node

NEVER_FITS = {**TRAIN, "gpus": 64}  # stays queued whatever the dispatcher does


@pytest.fixture(autouse=True)
def never_fits_is_parked(request):
    """The 64-GPU jobs here stay queued on a cordoned 64-GPU node (tests.factories.park_node):
    a job no node could ever fit is refused at submit (issue 30)."""
    if {"cast", "as_user"} & set(request.fixturenames):
        request.getfixturevalue("cast")
        park_node()


def cap(slug: str, jobs: int) -> None:
    quota_set(tenant=Tenant.objects.get(slug=slug), max_queued_jobs=jobs)


def submit(client, **body):
    return client.post("/api/v1/jobs/", {**NEVER_FITS, **body}, format="json")


def queue_of(slug: str) -> int:
    """Queued rows and virtual tasks."""
    rows = Job.objects.filter(tenant__slug=slug, state=JobState.QUEUED).count()
    virtual = sum(a.size - a.materialised for a in JobArray.objects.filter(tenant__slug=slug))
    return rows + virtual


def fills_the_queue_with_an_array_then_refuses_a_job(bob):
    cap("acme", 41)
    assert submit(bob, array="0-39").status_code == 201  # 1 row, 39 virtual tasks
    assert submit(bob).status_code == 201  # the 41st
    refused = submit(bob)
    assert refused.status_code == 429 and int(refused["Retry-After"]) > 0
    assert refused.json()["detail"] == ["tenant acme has 41 of 41 jobs queued"]
    assert queue_of("acme") == 41


def test_a_job_counts_the_arrays_virtual_tasks_against_the_cap(as_user):
    """In the test's transaction: the transaction's path (apps/admission/enqueue.py)."""
    fills_the_queue_with_an_array_then_refuses_a_job(as_user("bob"))


@pytest.mark.django_db(transaction=True)
def test_a_job_counts_the_arrays_virtual_tasks_against_the_cap_in_one_round_trip():
    """As in production: on PostgreSQL the one-round-trip path (rows.admit)."""
    people = make_cast()
    make_node("h1", "H100-80GB", 8)
    park_node()
    generous("acme")
    bob = client_for(people["bob"][1])
    assert submit(bob).status_code == 201  # the tenant's count row, for the fast path to lock
    Job.objects.filter(tenant__slug="acme").update(state=JobState.CANCELLED)
    fills_the_queue_with_an_array_then_refuses_a_job(bob)


@pytest.mark.skipif("connection.vendor != 'postgresql'", reason="SQLite has one writer at a time")
@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("waiting", [{}, {"array": "0-9"}], ids=["a job", "an array"])
def test_a_submit_that_waited_for_an_array_to_commit_counts_its_tasks(waiting):
    """The submit waits for the tenant's count row, which an array's submit holds until it
    commits; what it then counts must include that array's virtual tasks, which a statement that
    began before the wait cannot see (apps/admission/rows.py, "the queued-job cap")."""
    people = make_cast()
    make_node("h1", "H100-80GB", 8)
    park_node()
    generous("acme")
    cap("acme", 40)
    bob, alice = people["bob"][0], people["alice"][0]
    submit_job(user=bob, body=NEVER_FITS, idempotency_key=None)  # the tenant's count row
    Job.objects.filter(tenant__slug="acme").update(state=JobState.CANCELLED)
    holding, release = threading.Event(), threading.Event()

    def array_committing_late():
        try:
            with transaction.atomic():
                submit_job(user=alice, body={**NEVER_FITS, "array": "0-39"}, idempotency_key=None)
                holding.set()
                release.wait(10)
        finally:
            connection.close()

    other = threading.Thread(target=array_committing_late)
    other.start()
    assert holding.wait(10)
    threading.Timer(0.5, release.set).start()  # while the submit below waits for the lock
    try:
        with pytest.raises(QueueFull):
            submit_job(user=bob, body={**NEVER_FITS, **waiting}, idempotency_key=None)
    finally:
        release.set()
        other.join()
    assert queue_of("acme") == 40


@pytest.mark.skipif("connection.vendor != 'postgresql'", reason="the function is PostgreSQL's")
@pytest.mark.django_db(transaction=True)
def test_the_one_statement_submit_counts_the_queue_as_a_transactions_submit_does():
    """`gpuplatform_queue_room` (its migration's SQL) counts the arrays' virtual tasks as
    rows.queued_for_cap does: an open array's tasks without rows, not a cancelled array's, not
    a failed one's, not those of an array whose every task has its row."""
    from django.utils import timezone

    from apps.admission import rows

    people = make_cast()
    make_node("h1", "H100-80GB", 8)
    park_node()
    generous("acme")
    bob = people["bob"][0]
    tenant = Tenant.objects.get(slug="acme")
    submit_job(user=bob, body=NEVER_FITS, idempotency_key=None)  # a queued job, the count row
    shapes = [
        {"size": 10, "materialised": 3},  # 7 virtual
        {"size": 5, "materialised": 0, "cancelled_at": timezone.now()},
        {"size": 6, "materialised": 1, "failed_reason": "dependency failed (afterok)"},
        {"size": 4, "materialised": 4},
    ]
    for shape in shapes:
        JobArray.objects.create(name="a", tenant=tenant, user=bob, tier=tenant.tier, spec="0-1",
                                task={}, **shape)  # fmt: skip
    with transaction.atomic():
        expected = rows.queued_for_cap(tenant)
    with connection.cursor() as cursor:
        cursor.execute("SELECT * FROM gpuplatform_queue_room(%s, %s, %s)", [tenant.pk, 1, 9])
        queued, virtual, has_room = cursor.fetchone()
    assert (queued, virtual) == (1, 7) and queued + virtual == expected
    assert has_room is True  # 8 + 1 <= 9
    with connection.cursor() as cursor:
        cursor.execute("SELECT has_room FROM gpuplatform_queue_room(%s, %s, %s)", [tenant.pk, 2, 9])
        assert cursor.fetchone() == (False,)
