"""apps/admission/rows.py writes the submit path's statements by hand: what they read and write
must be exactly what the ORM reads and writes, field by field, on SQLite and on PostgreSQL."""

import pytest
from django.contrib.auth.models import User
from django.utils import timezone

from apps.admission import estimates, rows
from apps.jobs.models import Job, JobEvent, JobTemplate
from apps.nodes.models import GpuSku
from apps.scheduling.dispatcher import queue_position
from apps.tenants.models import ApiToken, Membership, Quota, Tenant, Tier
from apps.tenants.services import tenant_create, user_create
from apps.tenants.tokens import digest_of
from tests.admission.conftest import TRAIN


def values(instance) -> dict:
    return {
        field.attname: getattr(instance, field.attname)
        for field in type(instance)._meta.concrete_fields
    }


def test_the_membership_comes_with_its_tenant_tier_and_quota_as_the_orm_reads_them(cast):
    bob = cast["bob"][0]
    Quota.objects.filter(tenant__slug="acme").update(
        max_queued_jobs=7, gpu_hours_per_period=12, max_gpus={"H100-80GB": 4}
    )
    ours = rows.membership_of(bob)
    theirs = Membership.objects.select_related("tenant__tier", "tenant__quota").get(user=bob)
    assert values(ours) == values(theirs)
    assert values(ours.tenant) == values(theirs.tenant)
    assert values(ours.tenant.tier) == values(theirs.tenant.tier)
    assert values(ours.tenant.quota) == values(theirs.tenant.quota)
    assert ours.tenant.quota.effective() == theirs.tenant.quota.effective()
    with pytest.raises(AssertionError):  # the comparison can fail: a field read wrongly shows
        assert values(ours.tenant) == {**values(theirs.tenant), "slug": "other"}


def test_a_tenant_without_a_quota_row_and_a_user_without_a_tenant(cast):
    tenant_create(slug="initech", tier_name="free")
    Quota.objects.filter(tenant__slug="initech").delete()
    user, _ = user_create(username="peter", tenant_slug="initech", role="member")
    membership = rows.membership_of(user)
    assert membership.tenant.slug == "initech" and membership.tenant.tier.name == "free"
    assert not Tenant.quota.is_cached(membership.tenant)  # left for limits_of to create
    assert rows.membership_of(cast["staff"][0]) is None


def test_the_membership_statement_also_reads_the_template_and_sku_named(cast):
    bob = cast["bob"][0]
    membership = rows.membership_of(bob, template="demo-train", sku="no-such-sku")
    assert values(membership.named["template", "demo-train"]) == values(
        JobTemplate.objects.get(name="demo-train")
    )
    assert membership.named["sku", "no-such-sku"] is None
    assert values(membership.tenant) == values(Tenant.objects.get(slug="acme"))
    assert rows.membership_of(bob).named == {}


def test_the_token_and_its_user_read_as_drfs_lookup_reads_them(cast):
    bob, key = cast["bob"]
    token, user = rows.token_user(digest_of(key))
    theirs = ApiToken.objects.select_related("user").get(digest=digest_of(key))
    assert values(token) == values(theirs) and values(user) == values(theirs.user)
    assert token.user is user and user == bob
    assert (
        rows.token_user("no-such-token") is None and rows.token_submitter("no-such-token") is None
    )


def test_a_submits_token_lookup_reads_the_membership_as_membership_of_does(cast):
    bob, key = cast["bob"]
    Quota.objects.filter(tenant__slug="acme").update(max_queued_jobs=7, max_gpus={"H100-80GB": 4})
    token, user, ours = rows.token_submitter(
        digest_of(key), template="demo-train", sku="no-such-sku"
    )
    theirs = rows.membership_of(bob, template="demo-train", sku="no-such-sku")
    assert values(user) == values(bob) and ours.user is user
    for mine, other in ((ours, theirs), (ours.tenant, theirs.tenant), (ours.tenant.tier, theirs.tenant.tier),
                        (ours.tenant.quota, theirs.tenant.quota)):  # fmt: skip
        assert values(mine) == values(other)
    assert values(ours.named["template", "demo-train"]) == values(
        JobTemplate.objects.get(name="demo-train")
    )
    assert ours.named == {
        ("template", "demo-train"): ours.named["template", "demo-train"],
        ("sku", "no-such-sku"): None,
    }
    staff, staff_key = cast["staff"]
    token, user, membership = rows.token_submitter(digest_of(staff_key), template="demo-train")
    assert user == staff and membership is None  # in no tenant: the rest of the row is NULL


def test_templates_and_skus_read_as_the_orm_reads_them(cast):
    for name in JobTemplate.objects.values_list("name", flat=True):
        assert values(rows.template_named(name)) == values(JobTemplate.objects.get(name=name))
    assert values(rows.sku_named("H100-80GB")) == values(GpuSku.objects.get(name="H100-80GB"))
    assert rows.template_named("no-such") is None and rows.sku_named("no-such") is None


def test_an_inserted_job_and_event_read_back_as_written(cast):
    bob = cast["bob"][0]
    tenant = Tenant.objects.select_related("tier").get(slug="acme")
    job = Job(name="raw", tenant=tenant, user=bob, tier=tenant.tier, template=JobTemplate.objects.get(name="demo-train"),
              params={"steps": 3, "nested": {"a": [1, "é"]}}, command=None, gpus=2, nodes=3,
              gpu_sku=GpuSku.objects.get(name="H100-80GB"), node_selector={"zone": "b"}, max_runtime_seconds=77,
              checkpointable=True, cacheable=False, retry_on_failure=True, reason="waiting")  # fmt: skip
    event = JobEvent(job=job, actor="user:bob", reason="submitted", to_state="queued")
    unsaved = job
    job, event = rows.insert_job_and_event(
        job, event
    )  # the rows as saved (Model.from_db), not the ones given
    assert not job._state.adding and job.created_at is not None
    assert values(job) == values(unsaved) and job.tenant is tenant and event.job is job
    assert values(Job.objects.get(pk=job.pk)) == values(job)
    stored = JobEvent.objects.get(job=job)
    assert {k: v for k, v in values(stored).items() if k != "id"} == {
        k: v for k, v in values(event).items() if k != "id"
    }
    command = Job(
        name="cmd", tenant=tenant, user=bob, tier=tenant.tier, command=["python", "-c", "print(1)"]
    )
    rows.insert_job_and_event(command, JobEvent(job=command, actor="user:bob", to_state="queued"))
    assert Job.objects.get(pk=command.pk).command == ["python", "-c", "print(1)"]


def queued(tenant: Tenant, tier: Tier, user: User, n: int) -> list[Job]:
    return [Job.objects.create(name=f"j{i}", tenant=tenant, user=user, tier=tier) for i in range(n)]


def test_the_count_of_jobs_ahead_is_the_queue_position(cast):
    bob, dave = cast["bob"][0], cast["dave"][0]
    acme, globex = Tenant.objects.get(slug="acme"), Tenant.objects.get(slug="globex")
    enterprise, pro = Tier.objects.get(name="enterprise"), Tier.objects.get(name="pro")
    jobs = (
        queued(globex, pro, dave, 3)
        + queued(acme, enterprise, bob, 2)
        + queued(globex, pro, dave, 1)
    )
    Job.objects.filter(pk=jobs[1].pk).update(state="running")
    for job in Job.objects.filter(state="queued"):
        total, ahead = rows.queued_and_ahead(job)
        assert (total, ahead + 1) == (5, queue_position(job))
    assert rows.queued_kept(acme) == 2 and rows.queued_kept(globex) == 3  # kept by the triggers


def test_a_long_queue_answers_positions_from_counts_and_the_jobs_queued_since(
    cast, as_user, monkeypatch
):
    """Past QUEUE_LIMIT the 201's position comes from per-tier counts taken at most once a
    second plus the jobs queued since: exact, but for jobs that left the queue meanwhile."""
    monkeypatch.setattr(estimates, "QUEUE_LIMIT", 3)
    estimates.forget()
    dave = cast["dave"][0]
    globex, pro = Tenant.objects.get(slug="globex"), Tier.objects.get(name="pro")
    queued(globex, pro, dave, 4)
    bob, dave_client = as_user("bob"), as_user("dave")
    first = bob.post(
        "/api/v1/jobs/", TRAIN, format="json"
    ).json()  # enterprise: ahead of every pro job
    assert first["queue_position"] == 1 and first["estimated_start_at"] is not None
    assert estimates._long.counts is not None  # the queue is long: counts loaded
    answers = [dave_client.post("/api/v1/jobs/", TRAIN, format="json").json() for _ in range(3)]
    assert [a["queue_position"] for a in answers] == [6, 7, 8]
    assert all(a["estimated_start_at"] is None for a in answers)
    for answer in answers:
        assert (
            dave_client.get(f"/api/v1/jobs/{answer['id']}/").json()["queue_position"]
            == answer["queue_position"]
        )
    second = bob.post(
        "/api/v1/jobs/", TRAIN, format="json"
    ).json()  # behind the first enterprise job only
    assert second["queue_position"] == 2
    # Within the counts' second, a job that left the queue still counts as ahead; a GET is exact.
    Job.objects.filter(pk=first["id"]).update(state="cancelled", finished_at=timezone.now())
    late = dave_client.post("/api/v1/jobs/", TRAIN, format="json").json()
    assert late["queue_position"] in (9, 10)  # 10 when the counts are still those of before
    assert dave_client.get(f"/api/v1/jobs/{late['id']}/").json()["queue_position"] == 9


def test_the_201_is_what_the_job_serializer_says_of_the_created_job(cast, as_user, tmp_path):
    """The 201 comes from serializers.created_representation (JobSerializer's fields, with no
    attempts read and the position and estimate given): for a queued job, a command job, a job
    naming no SKU and a cache hit it equals JobSerializer's."""
    from apps.jobs.serializers import JobSerializer
    from tests.admission.conftest import INFER, placed_ids, run_to_end

    def same(answer):
        assert answer.status_code == 201, answer.content
        created = answer.json()
        job = Job.objects.get(pk=created["id"])
        context = {
            "queue_positions": {job.pk: created["queue_position"]},
            "estimator": _Fixed(created),
        }
        assert created == JobSerializer(job, context=context).data
        assert list(created) == list(JobSerializer(job, context=context).data)  # the same order too
        return created

    bob = as_user("bob")
    for body in [
        TRAIN,
        {"command": ["python", "-c", "print(1)"], "gpus": 0},
        {**TRAIN, "gpu_sku": None, "name": "any"},
    ]:
        same(bob.post("/api/v1/jobs/", body, format="json"))
    unknown = bob.post(
        "/api/v1/jobs/", {**TRAIN, "template": "no-such", "gpu_sku": "no-such"}, format="json"
    )
    assert unknown.status_code == 400 and set(unknown.json()) >= {"template", "gpu_sku"}, (
        unknown.json()
    )
    origin = same(bob.post("/api/v1/jobs/", INFER, format="json"))
    placed_ids()
    run_to_end(origin["id"], tmp=tmp_path)
    assert same(bob.post("/api/v1/jobs/", INFER, format="json"))["cache_hit"] is True


class _Fixed:
    def __init__(self, created):
        from django.utils.dateparse import parse_datetime

        self.start = (
            parse_datetime(created["estimated_start_at"]) if created["estimated_start_at"] else None
        )

    def estimate(self, job):
        return self.start


def test_the_statements_run_on_djangos_own_cursor_on_every_backend(cast):
    """rows.py uses public APIs only (`connection.cursor()`): every statement is recorded where
    Django records them, its placeholders are Django's, a duplicate key raises Django's
    IntegrityError and a broken transaction refuses further statements. (Until issue 15 SQLite's
    statements ran on sqlite3's own cursor and PostgreSQL's were prepared through Django's
    private cursor hooks; scripts/check_private_names.py now keeps such names out of apps/.)"""
    from django.db import IntegrityError, connection, transaction
    from django.db.transaction import TransactionManagementError
    from django.test.utils import CaptureQueriesContext

    bob, key = cast["bob"]
    with CaptureQueriesContext(connection) as ctx:  # recorded: every statement seen
        rows.token_user(digest_of(key))
    assert len(ctx.captured_queries) == 1
    assert (
        rows.token_user(digest_of(key))[1] == bob
    )  # '%s' written as the backend wants it (and '%%' as '%')
    job = Job(
        tenant=Tenant.objects.get(slug="acme"),
        user=bob,
        tier=Tier.objects.get(name="pro"),
        name="x",
    )
    rows.insert_job_and_event(
        job, JobEvent(job=job, actor="user:bob", reason="submitted", to_state="queued")
    )
    with transaction.atomic():
        with pytest.raises(
            IntegrityError
        ):  # Django's, as services.Admission expects: the same id again
            with transaction.atomic(savepoint=False):
                rows.insert_job_and_event(
                    job, JobEvent(job=job, actor="user:bob", to_state="queued")
                )
        with pytest.raises(
            TransactionManagementError
        ):  # a broken transaction takes no more statements
            rows.token_user(digest_of(key))
    assert Job.objects.filter(pk=job.pk).count() == 1


def test_every_submits_queue_window_is_a_prepared_statement_on_postgresql(cast):
    """The queue window each submit's answer reads (estimates.for_new_job) is planned once per
    connection: unprepared, it was a quarter of the server's CPU for a submit."""
    from django.db import connection

    if connection.vendor != "postgresql":
        pytest.skip("prepared statements are PostgreSQL's")
    since = timezone.now()
    for _ in range(6):
        found, total, _ = rows.queue_window(since)
        assert found == [] and total == 0
    with connection.cursor() as cursor:
        cursor.execute("SELECT statement FROM pg_prepared_statements")
        statements = [statement for (statement,) in cursor.fetchall()]
    assert any("UNION ALL" in s and "$2" in s for s in statements), statements


def test_the_per_request_lookups_are_prepared_statements_on_postgresql(cast, settings):
    """The token's and the submitter's lookups run on a server-binding cursor, so PostgreSQL
    plans them once per connection (`_prepared_cursor`); still Django's cursor wrapper: refused
    in a broken transaction. Where queries are logged, or GPUPLATFORM_DB_PREPARED=0, Django's
    own cursor: the log shows their SQL, and nothing is prepared."""
    from django.db import IntegrityError, connection, transaction
    from django.db.transaction import TransactionManagementError
    from django.test.utils import CaptureQueriesContext

    if connection.vendor != "postgresql":
        pytest.skip("prepared statements are PostgreSQL's; SQLite runs the lookups as before")

    def prepared() -> list[str]:
        with connection.cursor() as cursor:
            cursor.execute("SELECT statement FROM pg_prepared_statements")
            return [statement for (statement,) in cursor.fetchall()]

    bob, key = cast["bob"]
    settings.DB_PREPARED = False
    for _ in range(6):
        assert rows.membership_of(bob).tenant.slug == "acme"
    assert not any(s.startswith('SELECT "m"') for s in prepared())
    settings.DB_PREPARED = True
    for _ in range(6):
        token, user, membership = rows.token_submitter(digest_of(key))
        assert user == bob and membership.tenant.slug == "acme"
    assert any(
        s.startswith('SELECT "tk"') and "$" in s for s in prepared()
    )  # bound on the server, prepared
    with CaptureQueriesContext(connection) as ctx:
        for _ in range(6):
            rows.membership_of(bob)
    assert (
        len(ctx.captured_queries) == 6 and '"tenants_membership"' in ctx.captured_queries[0]["sql"]
    )
    assert not any(s.startswith('SELECT "m"') for s in prepared())
    for _ in range(6):
        rows.membership_of(bob)
    assert any(s.startswith('SELECT "m"') for s in prepared())
    with transaction.atomic():
        with pytest.raises(IntegrityError):
            Tenant.objects.create(slug="acme", name="again", tier=Tier.objects.get(name="pro"))
        with pytest.raises(TransactionManagementError):
            rows.token_user(digest_of(key))
