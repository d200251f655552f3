"""Result cache and coalescing for cacheable templates (demo-infer)."""

import concurrent.futures

import psycopg
import pytest
import requests
from django.db import IntegrityError, OperationalError, transaction

from apps.admission import dispatch, idempotency
from apps.admission.models import CachedJob, CacheRole, TemplateCachePolicy
from apps.admission.quotas import DispatchGate
from apps.jobs.models import GpuAllocation, Job, JobAttempt, JobState, JobTemplate
from apps.tenants.models import Tenant
from apps.tenants.services import quota_set
from tests.admission.conftest import INFER, placed_ids, run_to_end
from tests.factories import client_for, make_cast, make_node


def submit(client, body=INFER):
    response = client.post("/api/v1/jobs/", body, format="json")
    assert response.status_code == 201, response.content
    return response.json()


def ran_once(as_user, tmp_path, user="bob"):
    origin = submit(as_user(user))
    assert placed_ids() == {origin["id"]}
    run_to_end(origin["id"], tmp=tmp_path)
    return origin


def test_the_second_identical_request_is_a_hit_with_no_attempt_and_no_gpu(as_user, tmp_path):
    origin = ran_once(as_user, tmp_path)
    hit = submit(as_user("alice"))

    assert (hit["state"], hit["cache_hit"], hit["attempts"]) == ("succeeded", True, [])
    assert hit["reason"] == f"served from cache: result of job {origin['id']}"
    assert not JobAttempt.objects.filter(job_id=hit["id"]).exists()
    assert not GpuAllocation.objects.filter(attempt__job_id=hit["id"]).exists()
    assert placed_ids() == set()
    listed = as_user("alice").get(f"/api/v1/jobs/{hit['id']}/artifacts/").json()
    assert [a["name"] for a in listed] == ["output.json"]
    body = b"".join(
        as_user("alice").get(f"/api/v1/jobs/{hit['id']}/artifacts/output.json").streaming_content
    )
    assert body == b'{"text": "a GPU job"}'
    # Shared, not copied: the hit's row names the origin's stored file.
    files = set(Job.objects.get(pk=hit["id"]).artifacts.values_list("file", flat=True))
    assert files == set(Job.objects.get(pk=origin["id"]).artifacts.values_list("file", flat=True))


def test_another_tenants_identical_request_runs_on_its_own(as_user, tmp_path):
    ran_once(as_user, tmp_path)
    theirs = submit(as_user("dave"))
    assert theirs["state"] == "queued" and not theirs["cache_hit"]
    assert placed_ids() == {theirs["id"]}


def test_sampling_without_a_seed_is_never_cached_but_with_a_seed_it_is(as_user, tmp_path):
    sampled = {**INFER, "params": {"prompt": "hello", "temperature": 0.7}}
    first = submit(as_user("bob"), sampled)
    assert not CachedJob.objects.filter(job_id=first["id"]).exists()
    assert placed_ids() == {first["id"]}
    run_to_end(first["id"], tmp=tmp_path)
    assert submit(as_user("bob"), sampled)["state"] == "queued"

    seeded = {**INFER, "params": {"prompt": "hello", "temperature": 0.7, "seed": 7}}
    ran = submit(as_user("bob"), seeded)
    placed_ids()
    run_to_end(ran["id"], tmp=tmp_path)
    assert submit(as_user("bob"), seeded)["cache_hit"] is True


def test_a_template_version_bump_or_an_expired_ttl_invalidates(as_user, tmp_path):
    ran_once(as_user, tmp_path)
    JobTemplate.objects.filter(name="demo-infer").update(version=2)
    assert submit(as_user("bob"))["state"] == "queued"

    JobTemplate.objects.filter(name="demo-infer").update(version=1)
    TemplateCachePolicy.objects.create(
        template=JobTemplate.objects.get(name="demo-infer"), ttl_seconds=1
    )
    Job.objects.filter(cache_link__role="origin", state=JobState.SUCCEEDED).update(
        finished_at=Job.objects.get(
            cache_link__role="origin", state=JobState.SUCCEEDED
        ).finished_at.replace(year=2000)
    )
    assert submit(as_user("bob"))["state"] == "queued"


def test_an_identical_request_while_one_runs_joins_it_and_finishes_with_it(as_user, tmp_path):
    origin = submit(as_user("bob"))
    assert placed_ids() == {origin["id"]}
    follower = submit(as_user("alice"))
    assert follower["state"] == "queued"
    assert follower["reason"] == f"joined identical job {origin['id']}; finishes with it"
    assert placed_ids() == set()

    run_to_end(origin["id"], tmp=tmp_path)
    done = as_user("alice").get(f"/api/v1/jobs/{follower['id']}/").json()
    assert (done["state"], done["cache_hit"], done["attempts"]) == ("succeeded", True, [])
    assert [
        a["name"] for a in as_user("alice").get(f"/api/v1/jobs/{follower['id']}/artifacts/").json()
    ] == ["output.json"]


def test_cancelling_a_follower_leaves_the_leader_running(as_user, tmp_path):
    origin = submit(as_user("bob"))
    placed_ids()
    follower = submit(as_user("bob"))
    assert as_user("bob").post(f"/api/v1/jobs/{follower['id']}/cancel/").status_code == 200
    assert Job.objects.get(pk=origin["id"]).state == JobState.STARTING
    run_to_end(origin["id"], tmp=tmp_path)
    assert Job.objects.get(pk=follower["id"]).state == JobState.CANCELLED


def test_cancelling_the_leader_hands_over_to_its_oldest_follower(as_user, tmp_path):
    origin = submit(as_user("bob"))
    placed_ids()
    heir, other = submit(as_user("bob")), submit(as_user("alice"))
    as_user("bob").post(f"/api/v1/jobs/{origin['id']}/cancel/")

    assert (
        Job.objects.get(pk=heir["id"]).reason
        == f"took over from cancelled identical job {origin['id']}"
    )
    assert (
        Job.objects.get(pk=other["id"]).reason
        == f"joined identical job {heir['id']}; finishes with it"
    )
    # The cancelled leader's GPU is released when its agent reports; play that, then dispatch.
    attempt = JobAttempt.objects.get(job_id=origin["id"])
    from apps.jobs.services import attempt_member_finished

    attempt_member_finished(attempt_id=attempt.pk, rank=0, token=str(attempt.token), exit_code=-15)
    assert placed_ids() == {heir["id"]}
    run_to_end(heir["id"], tmp=tmp_path)
    assert Job.objects.get(pk=other["id"]).state == JobState.SUCCEEDED


def test_a_failed_leader_fails_its_followers_saying_why(as_user, tmp_path):
    origin = submit(as_user("bob"))
    placed_ids()
    follower = submit(as_user("bob"))
    run_to_end(origin["id"], exit_code=3, tmp=tmp_path)
    failed = Job.objects.get(pk=follower["id"])
    assert failed.state == JobState.FAILED
    assert failed.reason == f"the identical job {origin['id']} it joined failed: exit code 3"


# --- races (issue 36; the stress suite in tests/concurrency makes them happen) -----------------


def test_a_follower_that_joins_during_a_dispatch_pass_is_held_back_all_the_same(as_user):
    """The pass reads its gate, then its queue: a follower committed in between is in the queue.
    Read with the gate, the followers missed it, and it ran as a second execution."""
    origin = submit(as_user("bob"))
    gate = DispatchGate.load()  # the pass begins
    follower = submit(as_user("alice"))  # another web process, meanwhile
    job = Job.objects.get(pk=follower["id"])
    assert gate.hold(job)
    assert job.reason == f"waiting: joined identical job {origin['id']}; finishes with it"


def test_the_database_refuses_a_second_active_origin_for_one_key(as_user):
    origin = submit(as_user("bob"))
    link = CachedJob.objects.get(job_id=origin["id"])
    assert (link.role, link.active) == (CacheRole.ORIGIN, True)
    twin = submit(as_user("bob"), {**INFER, "params": {"prompt": "other"}})
    with pytest.raises(IntegrityError), transaction.atomic():
        CachedJob.objects.filter(job_id=twin["id"]).update(key=link.key, role=CacheRole.ORIGIN)


def test_an_origin_that_ended_is_no_longer_active_and_the_next_identical_job_starts_one(as_user, tmp_path):  # fmt: skip
    first = submit(as_user("bob"))
    placed_ids()
    run_to_end(first["id"], exit_code=3, tmp=tmp_path)
    assert not CachedJob.objects.get(job_id=first["id"]).active
    second = submit(as_user("bob"))
    assert CachedJob.objects.get(job_id=second["id"]).role == CacheRole.ORIGIN
    assert CachedJob.objects.filter(active=True).count() == 1


def test_an_heir_is_its_keys_one_active_origin(as_user):
    origin = submit(as_user("bob"))
    heir, other = submit(as_user("bob")), submit(as_user("alice"))
    as_user("bob").post(f"/api/v1/jobs/{origin['id']}/cancel/")
    active = CachedJob.objects.filter(active=True)
    assert [(link.job_id, link.role) for link in active] == [
        (Job.objects.get(pk=heir["id"]).pk, CacheRole.ORIGIN)
    ]
    assert CachedJob.objects.get(job_id=other["id"]).source_id == active[0].job_id


@pytest.mark.django_db(transaction=True)
def test_a_submit_aborted_by_a_deadlock_runs_again_whole_with_nothing_left_of_the_first_try(
    monkeypatch,
):
    """The first try gets as far as its job's row, its cache link and its dispatch request;
    PostgreSQL then picks it as a deadlock's victim. The second try is the only one that
    counts: one job, one link, one dispatch request (the first try's commit hook went with
    its rollback)."""
    people = make_cast()
    make_node("h1", "H100-80GB", 8)
    quota_set(
        tenant=Tenant.objects.get(slug="acme"), submit_rate_per_minute=1000, submit_burst=1000
    )
    remember, tries, requests_sent = idempotency.remember, [], []

    def deadlocked_once(**kwargs):
        tries.append(1)
        if len(tries) == 1:
            raise OperationalError("deadlock detected") from psycopg.errors.DeadlockDetected()
        return remember(**kwargs)

    monkeypatch.setattr(idempotency, "remember", deadlocked_once)
    monkeypatch.setattr(dispatch, "request_soon", lambda: requests_sent.append(1))
    made = submit(client_for(people["bob"][1]))
    assert len(tries) == 2
    assert [str(pk) for pk in Job.objects.values_list("pk", flat=True)] == [made["id"]]
    assert list(CachedJob.objects.values_list("role", "active")) == [(CacheRole.ORIGIN, True)]
    assert requests_sent == [1]


@pytest.mark.django_db(transaction=True)
def test_ten_identical_concurrent_requests_run_once(live_server, tmp_path):
    people = make_cast()
    make_node("h1", "H100-80GB", 8)
    quota_set(
        tenant=Tenant.objects.get(slug="acme"), submit_rate_per_minute=100_000, submit_burst=100_000
    )
    headers = {"Authorization": f"Token {people['bob'][1]}"}

    def submit_once(_):
        return requests.post(
            f"{live_server.url}/api/v1/jobs/", json=INFER, headers=headers, timeout=120
        ).json()

    with concurrent.futures.ThreadPoolExecutor(10) as pool:
        jobs = list(pool.map(submit_once, range(10)))

    roles = sorted(CachedJob.objects.values_list("role", flat=True))
    assert roles == ["follower"] * 9 + ["origin"]
    [origin] = placed_ids()
    run_to_end(origin, tmp=tmp_path)
    assert (
        Job.objects.filter(pk__in=[j["id"] for j in jobs], state=JobState.SUCCEEDED).count() == 10
    )
    assert JobAttempt.objects.count() == 1
