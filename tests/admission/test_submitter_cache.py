"""The per-process cache of submitters (apps/admission/submitters.py): a submit whose body names no
template or SKU reads no membership, tenant, tier or quota where its process kept them, and every
path that changes one of them drops what was kept, here at once and in the other processes
through Redis (tests/e2e/test_two_webs.py: within 2 s)."""

import time

import pytest
from django.contrib import admin
from django.contrib.auth import get_user_model
from django.core.management import call_command
from django.db import connection
from django.test.utils import CaptureQueriesContext

from apps.admission import rows, submitters
from apps.platform.redis import shared_client
from apps.tenants import token_cache
from apps.tenants.models import Membership, Quota, Role, Tenant, Tier
from apps.tenants.services import quota_set, tenant_create, user_create
from tests.admission.conftest import TRAIN, wait_until
from tests.factories import client_for

PLAIN = {"command": ["true"], "gpus": 1}  # names no template or SKU


pytestmark = pytest.mark.usefixtures("token_listener")


@pytest.fixture
def bob(cast):
    """Bob's client, his submitter kept by a first submit."""
    client = client_for(cast["bob"][1])
    assert client.post("/api/v1/jobs/", PLAIN, format="json").status_code == 201
    assert submitters.CACHE.get(cast["bob"][0]) is not None
    return client


def submit(client, body=PLAIN):
    return client.post("/api/v1/jobs/", body, format="json")


def submitter_reads(ctx) -> list[str]:
    return [q["sql"] for q in ctx.captured_queries if "tenants_membership" in q["sql"]]


def test_a_kept_submitter_costs_a_submit_no_statement(bob):
    with CaptureQueriesContext(connection) as ctx:
        answer = submit(bob)
    assert answer.status_code == 201, answer.content
    assert submitter_reads(ctx) == [], "\n".join(q["sql"] for q in ctx.captured_queries)


def test_a_body_naming_a_template_and_sku_reads_them_with_the_membership(bob):
    with CaptureQueriesContext(connection) as ctx:
        answer = submit(bob, TRAIN)
    assert answer.status_code == 201, answer.content
    assert len(submitter_reads(ctx)) == 1


def test_the_kept_submitter_is_what_a_read_gives(bob, cast):
    kept = submitters.CACHE.get(cast["bob"][0])
    read = rows.membership_of(cast["bob"][0])
    for got, want in [(kept, read), (kept.tenant, read.tenant), (kept.tenant.tier, read.tenant.tier),
                      (kept.tenant.quota, read.tenant.quota)]:  # fmt: skip
        assert token_cache.columns(got) == token_cache.columns(want)
    assert kept.user == cast["bob"][0] and kept.named == {}


def test_a_quota_lowered_with_set_quota_refuses_the_next_submit(bob):
    quota_set(tenant=Tenant.objects.get(slug="acme"), max_queued_jobs=1)
    answer = submit(bob)
    assert answer.status_code == 429 and "1 of 1 jobs queued" in str(answer.json()), answer.json()


def test_a_tenant_moved_to_another_tier_with_create_tenant_submits_at_that_tier(bob):
    tenant_create(slug="acme", tier_name="pro", allow_commands=True)
    assert submit(bob).json()["tier"] == "pro"


def test_a_member_made_viewer_with_create_user_may_no_longer_submit(bob):
    user_create(username="bob", tenant_slug="acme", role=Role.VIEWER, token=None)
    assert submit(bob).status_code == 403


def test_set_tier_drops_every_submitter_of_that_tier(bob, cast):
    call_command("set_tier", "enterprise", "--min-runtime-seconds", "5", stdout=None)
    assert submitters.CACHE.get(cast["bob"][0]) is None


def change_in_admin(model, obj, **values) -> None:
    for name, value in values.items():
        setattr(obj, name, value)
    admin.site.get_model_admin(model).save_model(None, obj, None, True)


def test_a_tier_changed_in_the_admin_holds_at_the_next_submit(bob):
    change_in_admin(Tier, Tier.objects.get(name="enterprise"), max_queued_jobs=1)
    assert submit(bob).status_code == 429


def test_a_tenant_changed_in_the_admin_holds_at_the_next_submit(bob):
    change_in_admin(Tenant, Tenant.objects.get(slug="acme"), tier=Tier.objects.get(name="pro"))
    assert submit(bob).json()["tier"] == "pro"


def test_a_quota_changed_in_the_admin_holds_at_the_next_submit(bob):
    change_in_admin(Quota, Quota.objects.get(tenant__slug="acme"), max_queued_jobs=1)
    assert submit(bob).status_code == 429


def test_a_membership_changed_in_the_admin_holds_at_the_next_submit(bob, cast):
    change_in_admin(Membership, Membership.objects.get(user=cast["bob"][0]), role=Role.VIEWER)
    assert submit(bob).status_code == 403


def test_a_membership_given_to_another_user_in_the_admin_leaves_its_old_user_in_none(bob, cast):
    frank = get_user_model().objects.create(username="frank")
    change_in_admin(Membership, Membership.objects.get(user=cast["bob"][0]), user=frank)
    answer = submit(bob)
    assert answer.status_code == 403 and "no tenant" in str(answer.json()), answer.json()


def test_a_membership_deleted_in_the_admin_holds_at_the_next_submit(bob, cast):
    membership = Membership.objects.get(user=cast["bob"][0])
    admin.site.get_model_admin(Membership).delete_model(None, membership)
    assert submit(bob).status_code == 403


@pytest.mark.parametrize("kind", ["tenant", "tier", "user"])
def test_a_change_published_by_another_process_drops_the_submitter_within_2_s(bob, cast, kind):
    """What another web process's change sends after its commit (the message alone must drop it)."""
    user = cast["bob"][0]
    tenant = Tenant.objects.get(slug="acme")
    owner = {"tenant": tenant.pk, "tier": tenant.tier_id, "user": user.pk}[kind]

    shared_client().publish(token_cache.CHANNEL, f"{kind}:{owner}")

    assert wait_until(lambda: submitters.CACHE.get(user) is None)


def test_another_tenants_change_keeps_the_submitter(bob, cast):
    token_cache.tenants_changed(tenant_ids=[Tenant.objects.get(slug="globex").pk])
    assert submitters.CACHE.get(cast["bob"][0]) is not None


def test_a_read_that_raced_a_change_is_not_kept(cast):
    user = cast["bob"][0]
    epoch = submitters.CACHE.epoch  # a request starts reading the membership
    token_cache.tenants_changed(tenant_ids=[Tenant.objects.get(slug="acme").pk])  # heard meanwhile
    submitters.CACHE.put(user, rows.membership_of(user), epoch=epoch)
    assert submitters.CACHE.get(user) is None


def test_kept_submitters_live_at_most_the_setting(bob, cast, settings, monkeypatch):
    settings.TOKEN_CACHE_SECONDS = 5
    user = cast["bob"][0]
    assert submitters.CACHE.get(user) is not None
    later = time.monotonic() + 5
    monkeypatch.setattr(token_cache.time, "monotonic", lambda: later)
    assert submitters.CACHE.get(user) is None


def test_a_forked_process_starts_with_no_kept_submitter(bob, cast, monkeypatch):
    """A web worker forked from a process that kept submitters heard nothing of what changed
    since: its first read starts its own listener and finds nothing kept."""
    user = cast["bob"][0]
    assert submitters.CACHE.get(user) is not None
    monkeypatch.setattr(token_cache.CACHE.listener, "pid", -1)  # the listener of the parent
    assert submitters.CACHE.get(user) is None


def test_what_a_request_changes_on_its_submitter_reaches_no_other(bob, cast):
    user = cast["bob"][0]
    first = submitters.CACHE.get(user)
    first.role = Role.VIEWER
    first.tenant.tier.rank = 99
    first.tenant.quota.max_gpus["H100-80GB"] = 1
    second = submitters.CACHE.get(user)
    assert second.role == Role.MEMBER and second.tenant.tier.rank != 99
    assert second.tenant.quota.max_gpus == {}
