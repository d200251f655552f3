"""The dispatcher's kept cluster state (apps/scheduling/kept.py): after every kind of change it
equals a fresh read of the database, brought up to date from what moved where it can be, read
again whole where it cannot."""

import gc
import re
from datetime import datetime, timedelta

import pytest
from django.conf import settings
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from apps.jobs import services
from apps.jobs.models import GpuAllocation, Job, JobAttempt
from apps.nodes.models import Gpu, Node
from apps.nodes.services import mark_silent_nodes_lost, node_heartbeat, node_set_state
from apps.platform.agent_protocol import GpuInfo
from apps.scheduling import core, kept
from apps.scheduling.core import policy
from apps.scheduling.dispatcher import dispatch_once
from apps.tenants.models import Tenant, Tier
from tests.factories import make_cast, make_node
from tests.unit.test_dispatcher import submit

HALF_LIFE_S = 3600.0


@pytest.fixture
def cast(db):
    return make_cast()


def refreshed() -> kept.State:
    """The kept state, brought up to date as a pass would."""
    state = kept.KEPT.pass_state(core.FGDPlus())
    kept.KEPT.done(state, [])
    return state


def assert_kept_is_a_fresh_read(*, read_again: bool = False) -> None:
    rebuilds = kept.KEPT.rebuilds
    state = refreshed()
    assert kept.KEPT.rebuilds == rebuilds + (1 if read_again else 0)
    fresh = kept.State(core.FGDPlus()).load()
    assert state.same_as(fresh)
    assert sorted(p.name for p in state.cluster.list_pods()) == sorted(
        p.name for p in fresh.cluster.list_pods()
    )
    now = timezone.now()
    usage = kept.KEPT.usage(state, now, HALF_LIFE_S)
    expected = kept.tenant_usage(now, HALF_LIFE_S)
    assert usage.keys() == expected.keys()
    for tenant, got in usage.items():
        assert got.tier == expected[tenant].tier
        assert got.gpu_seconds == pytest.approx(expected[tenant].gpu_seconds)


def started(job) -> JobAttempt:
    attempt = job.attempts.get(ended_at=None)
    services.attempt_member_started(attempt_id=attempt.pk, rank=0, token=str(attempt.token), pid=1)
    return attempt


def test_it_follows_placements_starts_checkpoints_and_ends_without_reading_it_all(cast):
    make_node("h1", gpus=4)
    make_node("h2", gpus=4)
    jobs = [submit(cast, gpus=2) for _ in range(3)]
    assert len(dispatch_once().placed) == 3
    assert_kept_is_a_fresh_read()
    attempts = [started(job) for job in jobs]
    assert_kept_is_a_fresh_read()
    services.attempt_progress(attempt_id=attempts[0].pk, token=str(attempts[0].token), progress=0.5,
                              checkpoint="/ckpt/1")  # fmt: skip
    assert_kept_is_a_fresh_read()
    services.attempt_member_finished(attempt_id=attempts[1].pk, rank=0, token=str(attempts[1].token),
                                     exit_code=0, reason="done")  # fmt: skip
    assert_kept_is_a_fresh_read()
    assert dispatch_once().placed == []
    assert_kept_is_a_fresh_read()
    big = submit(cast, gpus=4)  # fits nowhere yet: a reservation, tried against the cluster
    assert dispatch_once().placed == []
    big.refresh_from_db()
    assert big.reason.startswith("first in line")
    assert_kept_is_a_fresh_read()


def test_a_placement_by_another_dispatcher_shows_at_the_next_pass(cast):
    make_node("h1", gpus=2)
    dispatch_once()  # the state is kept from here on
    theirs = submit(cast, gpus=2)
    other = kept.State(core.FGDPlus()).load()  # another dispatcher's own read
    placement = other.cluster.schedule_pod(core.Pod(name=str(theirs.pk), gpus=2))
    assert placement is not None
    node = Node.objects.get(name="h1")
    gpus = dict(Gpu.objects.filter(node=node).values_list("index", "pk"))
    indices = placement.assignments[0].gpu_indices
    services.job_place(job=theirs, members=[services.MemberPlacement(
        node_id=node.pk, gpu_ids=[gpus[i] for i in indices], gpu_indices=list(indices))],
        why="the other dispatcher")  # fmt: skip
    mine = submit(cast, gpus=2)
    assert dispatch_once().placed == []  # it sees the GPUs taken: no race to lose
    assert str(theirs.pk) in {p.name for p in kept.KEPT.current().cluster.list_pods()}
    assert GpuAllocation.objects.filter(released_at=None).count() == 2
    mine.refresh_from_db()
    assert mine.state == "queued"


@pytest.fixture
def free_tenant(cast):
    from apps.tenants.services import tenant_create, user_create

    Tier.objects.filter(name="free").update(min_runtime_seconds=0)
    tenant_create(slug="hobby", tier_name="free")
    cast["erin"] = user_create(username="erin", tenant_slug="hobby")
    return cast


def test_a_preemption_is_followed_and_its_victim_read_again(free_tenant):
    make_node("h1", gpus=4)
    victim = submit(free_tenant, "erin", gpus=4)
    dispatch_once()
    started(victim)
    urgent = submit(free_tenant, "bob", gpus=4)
    assert dispatch_once().preempted == [str(victim.pk)]
    assert_kept_is_a_fresh_read()
    running = {job.job_id: job for job in kept.KEPT.current().snapshot(None).running}
    assert running[str(victim.pk)].preempted_for == str(urgent.pk)
    assert dispatch_once().preempted == []  # no second preemption while it stops


def test_a_victim_the_preemption_did_not_reach_is_read_again(free_tenant, monkeypatch):
    """The policy marks its victims in the kept state; when the preemption is not applied, the
    next pass reads them as the database has them."""
    from apps.scheduling import dispatcher

    make_node("h1", gpus=4)
    victim = submit(free_tenant, "erin", gpus=4)
    dispatch_once()
    started(victim)
    submit(free_tenant, "bob", gpus=4)
    monkeypatch.setattr(dispatcher, "_apply_preempt", lambda *args: [])
    assert dispatch_once().preempted == []
    assert_kept_is_a_fresh_read()
    running = {job.job_id: job for job in kept.KEPT.current().snapshot(None).running}
    assert running[str(victim.pk)].preempted_for is None


def test_a_node_cordoned_lost_or_with_an_unhealthy_gpu_reads_it_all_again(cast, settings):
    busy = make_node("h1", gpus=2)
    make_node("h2", gpus=2)
    make_node("h3", gpus=2)
    job = submit(cast, gpus=2)
    dispatch_once()
    assert_kept_is_a_fresh_read()
    node_set_state(node=Node.objects.get(name="h2"), state="draining")
    assert_kept_is_a_fresh_read(read_again=True)
    Node.objects.filter(name="h3").update(last_heartbeat_at=timezone.now() - timedelta(hours=1))
    assert mark_silent_nodes_lost() == ["h3"]
    assert_kept_is_a_fresh_read(read_again=True)
    node_heartbeat(name="h1", agent_instance=busy.agent_instance,
                   gpus=[GpuInfo(index=0, uuid="GPU-h1-0", healthy=False),
                         GpuInfo(index=1, uuid="GPU-h1-1")])  # fmt: skip
    assert_kept_is_a_fresh_read(read_again=True)
    view = kept.KEPT.current().cluster.node_view("h1")
    assert view.healthy == [False, True] and view.pods == [str(job.pk)]


def test_a_change_no_stamp_covers_shows_at_the_minutes_full_read(cast, monkeypatch, caplog):
    """The periodic full read compares the kept state with the database and keeps the read."""
    make_node("h1", gpus=2)
    job = submit(cast, gpus=2)
    dispatch_once()
    refreshed()
    kept.KEPT.current().cluster.remove_pod(str(job.pk))  # a kept state gone wrong
    monkeypatch.setattr(kept, "REBUILD_EVERY_S", 0.0)
    assert_kept_is_a_fresh_read(read_again=True)
    assert "differed from a full read" in caplog.text


def test_a_placement_refused_by_the_allocation_index_reads_it_all_next_pass(cast):
    make_node("h1", gpus=2)
    holder = submit(cast, gpus=2)
    dispatch_once()
    stale = refreshed()  # it misses the holder: h1 looks free
    del stale.holdings[holder.attempts.get().pk]
    stale.cluster.remove_pod(str(holder.pk))
    waiting = submit(cast, gpus=2)
    assert dispatch_once().placed == []  # the database said no
    assert GpuAllocation.objects.filter(released_at=None).count() == 2
    assert_kept_is_a_fresh_read(read_again=True)
    waiting.refresh_from_db()
    assert waiting.state == "queued"


def test_a_large_kept_state_is_frozen_out_of_full_collections(cast, monkeypatch):
    monkeypatch.setattr(kept, "FREEZE_FROM", 1)
    make_node("h1", gpus=2)
    submit(cast, gpus=2)
    dispatch_once()
    kept.KEPT.forget()
    dispatch_once()  # a full read of one held attempt
    assert gc.get_freeze_count() > 0
    kept.KEPT.forget()
    assert gc.get_freeze_count() == 0


def direct_usage(since, now, half_life_s: float) -> dict[str, float]:
    """Each tenant's decayed GPU-seconds summed from the attempts' rows, as policy defines it."""
    runs: dict[str, list] = {}
    for attempt in JobAttempt.objects.filter(started_at__isnull=False).select_related(
        "job__tenant"
    ):
        if attempt.ended_at is not None and attempt.ended_at < since:
            continue
        end = attempt.ended_at or now
        runs.setdefault(attempt.job.tenant.slug, []).append(
            (kept.epoch(attempt.started_at), kept.epoch(end), attempt.job.gpus)
        )
    return {t: policy.decayed_gpu_seconds(r, kept.epoch(now), half_life_s) for t, r in runs.items()}


def test_usage_summed_as_it_changes_equals_the_sum_over_every_attempt(cast):
    """UsageSpans keeps the ended attempts' usage as one sum per tenant and adds what changed:
    after starts, ends, an end read again, a half-life changed and an attempt leaving the window,
    it equals the sum over every attempt in the window."""
    make_node("h1", gpus=8)
    make_node("h2", gpus=8)
    jobs = [submit(cast, user=("bob" if i % 2 else "dave"), gpus=1 + i % 2) for i in range(6)]
    assert len(dispatch_once().placed) == 6
    attempts = [started(job) for job in jobs]
    now = timezone.now()
    for index, attempt in enumerate(attempts):  # started 10 to 60 minutes ago
        JobAttempt.objects.filter(pk=attempt.pk).update(
            started_at=now - timedelta(minutes=10 * (index + 1))
        )
    since = now - timedelta(seconds=4 * HALF_LIFE_S)
    spans = kept.UsageSpans(since)

    def check(at, half_life=HALF_LIFE_S, window_start=since):
        got = spans.usage(at, half_life)
        expected = direct_usage(window_start, at, half_life)
        assert got.keys() == expected.keys()
        for tenant, value in expected.items():
            assert got[tenant].gpu_seconds == pytest.approx(value, rel=1e-9)

    check(now)
    for attempt in attempts[:3]:
        services.attempt_member_finished(attempt_id=attempt.pk, rank=0, token=str(attempt.token),
                                         exit_code=0, reason="done")  # fmt: skip
    assert spans.refresh(since)
    later = timezone.now() + timedelta(seconds=90)
    check(later)
    assert spans.refresh(since)  # the same ends read again (the end-time read's margin)
    check(later)
    check(later + timedelta(hours=3))  # past a half-life: summed afresh
    check(later, half_life=600.0)  # another half-life
    # The first attempt ended long ago: it leaves the window when the window passes its end.
    JobAttempt.objects.filter(pk=attempts[0].pk).update(ended_at=now - timedelta(minutes=5))
    spans = kept.UsageSpans(since)
    window = now - timedelta(minutes=4)
    assert spans.refresh(window)
    check(timezone.now(), window_start=window)  # after every end (an end after it counts whole)


def test_a_pass_sums_only_the_running_attempts_not_every_ended_one(cast, monkeypatch):
    make_node("h1", gpus=8)
    jobs = [submit(cast, gpus=1) for _ in range(6)]
    assert len(dispatch_once().placed) == 6
    attempts = [started(job) for job in jobs]
    for attempt in attempts[:4]:
        services.attempt_member_finished(attempt_id=attempt.pk, rank=0, token=str(attempt.token),
                                         exit_code=0, reason="done")  # fmt: skip
    spans = kept.UsageSpans(timezone.now() - timedelta(seconds=4 * HALF_LIFE_S))
    spans.usage(timezone.now(), HALF_LIFE_S)  # the first: every attempt summed
    summed = []
    real = policy.decayed_gpu_seconds

    def counting(runs, now, half_life_s):
        runs = list(runs)
        summed.extend(runs)
        return real(runs, now, half_life_s)

    monkeypatch.setattr(kept.policy, "decayed_gpu_seconds", counting)
    spans.usage(timezone.now(), HALF_LIFE_S)
    assert len(summed) == 2  # the two running; the four ended are one kept sum


def test_a_refresh_reads_again_no_end_it_keeps(cast, monkeypatch):
    """The ends within the margin of the last check are read for what they add; those already
    kept are not read again (an attempt's end is written once)."""
    make_node("h1", gpus=8)
    jobs = [submit(cast, gpus=1) for _ in range(4)]
    assert len(dispatch_once().placed) == 4
    attempts = [started(job) for job in jobs]

    def finish(attempt):
        services.attempt_member_finished(attempt_id=attempt.pk, rank=0, token=str(attempt.token),
                                         exit_code=0, reason="done")  # fmt: skip

    for attempt in attempts[:3]:
        finish(attempt)
    since = timezone.now() - timedelta(seconds=4 * HALF_LIFE_S)
    spans = kept.UsageSpans(since)
    read = []
    real_add = kept.UsageSpans._add

    def add(self, rows):
        read.extend(row[0] for row in rows)  # `reads.SPAN_FIELDS`: the attempt's id first
        real_add(self, rows)

    monkeypatch.setattr(kept.UsageSpans, "_add", add)
    assert spans.refresh(since)
    assert read == []  # three ends within the margin, all kept already
    finish(attempts[3])
    assert spans.refresh(since)
    assert read == [attempts[3].pk]  # the new end, once
    assert spans.refresh(since)
    assert read == [attempts[3].pk]


def finished(attempt: JobAttempt) -> None:
    services.attempt_member_finished(attempt_id=attempt.pk, rank=0, token=str(attempt.token),
                                     exit_code=0, reason="done")  # fmt: skip


def test_a_refresh_reads_the_attempts_that_started_or_ended_in_one_statement(cast):
    """When the running attempts' stamp moves, their ids are read, then the attempts that started
    or ended and the ends since the last check in one statement (they were two)."""
    make_node("h1", gpus=8)
    jobs = [submit(cast, user=("bob" if i % 2 else "dave")) for i in range(4)]
    assert len(dispatch_once().placed) == 4
    attempts = [started(job) for job in jobs[:3]]
    since = timezone.now() - timedelta(seconds=4 * HALF_LIFE_S)
    spans = kept.UsageSpans(since)
    finished(attempts[0])
    finished(attempts[1])
    started(jobs[3])
    stamp = kept.pass_stamps().live
    with CaptureQueriesContext(connection) as reads:
        assert spans.refresh(since, stamp)
    assert len(reads.captured_queries) == 2  # the running ids; what moved or ended
    running = JobAttempt.objects.filter(started_at__isnull=False, ended_at=None)
    assert spans.running == set(running.values_list("pk", flat=True))
    now = timezone.now()
    expected = direct_usage(since, now, HALF_LIFE_S)
    got = spans.usage(now, HALF_LIFE_S)
    assert got.keys() == expected.keys()
    for tenant, value in expected.items():
        assert got[tenant].gpu_seconds == pytest.approx(value, rel=1e-9)


def test_a_full_read_of_the_cluster_keeps_the_usage_and_brings_it_up_to_date(cast, monkeypatch):
    """A node that comes reads the cluster whole, not the usage (every attempt of the window):
    the kept spans are brought up to date; they are read whole every REBUILD_EVERY_S."""
    make_node("h1", gpus=4)
    jobs = [submit(cast, user=("bob" if i % 2 else "dave")) for i in range(3)]
    dispatch_once()
    attempts = [started(job) for job in jobs]
    assert_kept_is_a_fresh_read()
    built = []
    real = kept.UsageSpans.__init__

    def counted(self, *args, **kwargs):
        built.append(self)
        real(self, *args, **kwargs)

    make_node("h2", gpus=4)  # a node came: the cluster is read whole at the next pass
    finished(attempts[0])
    rebuilds = kept.KEPT.rebuilds
    state = refreshed()
    assert kept.KEPT.rebuilds == rebuilds + 1
    now = timezone.now()
    monkeypatch.setattr(kept.UsageSpans, "__init__", counted)
    usage = kept.KEPT.usage(state, now, HALF_LIFE_S)
    assert built == []
    monkeypatch.setattr(kept, "REBUILD_EVERY_S", 0.0)
    kept.KEPT.usage(refreshed(), now, HALF_LIFE_S)
    assert len(built) == 1  # due: read whole
    expected = direct_usage(now - timedelta(seconds=4 * HALF_LIFE_S), now, HALF_LIFE_S)
    assert usage.keys() == expected.keys()
    for tenant, value in expected.items():
        assert usage[tenant].gpu_seconds == pytest.approx(value, rel=1e-9)


def test_the_pass_stamps_read_what_the_state_and_usage_were_read_from(cast):
    """kept.pass_stamps (one UNION ALL) gives the tiers' graces, the tenants allowed commands and
    the settings; the GPUs' count, id sum and unhealthy ids; the held allocations' count, id sum
    and versions; the running attempts' count, id sum and latest start: plain ints (PostgreSQL's
    union sums are numerics) and an aware datetime (SQLite's is raw text), 0 for a sum of none."""
    graces = tuple(sorted(Tier.objects.values_list("pk", "preemption_grace_seconds")))
    acme = Tenant.objects.get(slug="acme").pk
    configured = (settings.TRUST_UNISOLATED_NODES, settings.KILL_GRACE_SECONDS)
    empty = kept.pass_stamps()
    assert empty == ((graces, (acme,), *configured), (0, 0, ()), (0, 0, 0, 0), (0, 0, None), [])
    node = make_node("h1", gpus=4)
    make_node("h2", gpus=2)
    Gpu.objects.filter(node=node, index__in=[1, 3]).update(health="unhealthy")
    Tenant.objects.update(allow_commands=True)
    job = submit(cast)
    dispatch_once()
    attempt = started(job)
    attempt.refresh_from_db()
    got = kept.pass_stamps()
    gpus = list(Gpu.objects.order_by("pk").values_list("pk", flat=True))
    unhealthy = tuple(
        Gpu.objects.filter(health="unhealthy").order_by("pk").values_list("pk", flat=True)
    )
    allocation = GpuAllocation.objects.get(released_at=None)
    tenants = tuple(Tenant.objects.order_by("pk").values_list("pk", flat=True))
    assert got.settings == (graces, tenants, *configured)
    assert got.gpus == (6, sum(gpus), unhealthy) and len(unhealthy) == 2
    assert got.allocations == (
        1,
        allocation.pk,
        attempt.version,
        Job.objects.get(pk=job.pk).version,
    )
    assert got.live == (1, attempt.pk, attempt.started_at)
    assert got.checkpoints == []
    assert all(
        type(v) is int for v in (*got.gpus[:2], *got.gpus[2], *got.allocations, *got.live[:2])
    )
    assert isinstance(got.live[2], datetime) and got.live[2].tzinfo is not None


def test_a_full_read_and_the_usage_read_after_it_share_one_read_of_the_stamps(cast):
    """State.load takes its stamps from pass_stamps, and the usage's first read after it
    (UsageSpans) the running attempts' stamp from that same read: one statement where the full
    read's GPU, tenant and the usage's own stamps were four."""
    make_node("h1", gpus=4)
    job = submit(cast)
    dispatch_once()
    started(job)
    kept.KEPT.forget()
    rebuilds = kept.KEPT.rebuilds
    with CaptureQueriesContext(connection) as reads:
        state = kept.KEPT.pass_state(core.FGDPlus())
        try:
            usage = kept.KEPT.usage(state, timezone.now(), HALF_LIFE_S)
        finally:
            kept.KEPT.done(state, [])
    assert kept.KEPT.rebuilds == rebuilds + 1 and usage.keys() == {"acme"}
    stamps = [q["sql"] for q in reads.captured_queries
              if re.search(r"COUNT\(|WHERE allow_commands|WHERE health <>", q["sql"])]  # fmt: skip
    assert len(stamps) == 1 and "UNION ALL" in stamps[0]


def test_the_pass_stamps_read_the_checkpoints_saved_since(cast):
    """With `checkpoints_after`, the same statement reads the active attempts' checkpoints at
    or after it, as aware datetimes (SQLite's raw text too), equal to the ORM's read."""
    make_node("h1", gpus=4)
    job = submit(cast)
    dispatch_once()
    attempt = started(job)
    before = timezone.now() - timedelta(seconds=1)
    assert kept.pass_stamps(checkpoints_after=before)[4] == []
    saved = timezone.now()
    JobAttempt.objects.filter(pk=attempt.pk).update(checkpoint_at=saved)
    assert kept.pass_stamps(checkpoints_after=before)[4] == [(attempt.pk, saved)]
    assert kept.pass_stamps(checkpoints_after=saved + timedelta(seconds=1))[4] == []
