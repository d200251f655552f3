"""The per-process token cache (apps/tenants/token_cache.py): a known token costs no statement,
and every revocation path drops it, here at once and in other processes through Redis."""

import time

import pytest
from django.contrib import admin
from django.contrib.auth import get_user_model
from django.db import connection
from django.test.utils import CaptureQueriesContext

from apps.platform.redis import shared_client
from apps.tenants import token_cache
from apps.tenants.models import ApiToken
from apps.tenants.services import user_create
from apps.tenants.tokens import digest_of, token_issue, token_revoke
from tests.admission.conftest import wait_until
from tests.factories import client_for

pytestmark = pytest.mark.usefixtures("token_listener")


def token_reads(captured) -> list[str]:
    return [q["sql"] for q in captured if "tenants_apitoken" in q["sql"]]


def status(key: str) -> int:
    return client_for(key).get("/api/v1/jobs/").status_code


def test_a_second_request_reads_nothing_for_its_token(cast):
    _, key = cast["bob"]
    assert status(key) == 200
    with CaptureQueriesContext(connection) as second:
        assert status(key) == 200
    assert token_reads(second.captured_queries) == []


def test_a_cached_submit_reads_the_membership_once_and_is_admitted(as_user, cast):
    from tests.admission.conftest import TRAIN

    bob = as_user("bob")
    assert bob.get("/api/v1/jobs/").status_code == 200
    with CaptureQueriesContext(connection) as ctx:
        response = bob.post("/api/v1/jobs/", TRAIN, format="json")
    assert response.status_code == 201, response.content
    reads = [q["sql"] for q in ctx.captured_queries]
    assert token_reads(ctx.captured_queries) == []
    assert sum("tenants_membership" in sql for sql in reads) == 1, "\n\n".join(reads)


@pytest.mark.parametrize("how", ["by name", "all", "rotated"])
def test_a_revoked_or_rotated_token_is_refused_by_this_process_at_once(cast, how):
    bob, key = cast["bob"]
    assert status(key) == 200
    name = ApiToken.objects.get(digest=digest_of(key)).name
    if how == "by name":
        token_revoke(user=bob, name=name)
    elif how == "all":
        token_revoke(user=bob, everything=True)
    else:
        token_issue(user=bob, name=name)
    assert status(key) == 401


def test_a_user_made_inactive_or_deleted_in_the_admin_is_refused_at_once(cast):
    user_admin = admin.site.get_model_admin(get_user_model())
    bob, bob_key = cast["bob"]
    carol, carol_key = cast["carol"]
    assert status(bob_key) == 200 and status(carol_key) == 200

    bob.is_active = False
    user_admin.save_model(None, bob, None, True)
    user_admin.delete_queryset(None, get_user_model().objects.filter(pk=carol.pk))

    assert status(bob_key) == 401 and status(carol_key) == 401


def test_a_token_deleted_in_the_admin_is_refused_at_once(cast):
    token_admin = admin.site.get_model_admin(ApiToken)
    _, key = cast["bob"]
    assert status(key) == 200
    token_admin.delete_model(None, ApiToken.objects.get(digest=digest_of(key)))
    assert status(key) == 401


def test_a_revocation_published_by_another_process_drops_the_token_within_2_s(cast):
    """What another web process's revocation sends (its commit in its own database connection is
    not this test's: the message alone must drop the entry)."""
    _, key = cast["bob"]
    assert status(key) == 200
    digest = digest_of(key)
    assert token_cache.CACHE.get(digest) is not None

    shared_client().publish(token_cache.CHANNEL, f"token:{digest}")

    assert wait_until(lambda: token_cache.CACHE.get(digest) is None)


def test_a_read_that_raced_a_revocation_is_not_kept(cast):
    bob, key = cast["bob"]
    digest = digest_of(key)
    epoch = token_cache.CACHE.epoch  # a request starts reading the row
    token_cache.CACHE.drop([f"user:{bob.pk}"])  # a revocation is heard meanwhile
    token = ApiToken.objects.select_related("user").get(digest=digest)
    token_cache.CACHE.put(digest, token, token.user, epoch=epoch)
    assert token_cache.CACHE.get(digest) is None


def test_another_caches_message_neither_drops_a_token_nor_refuses_its_fill(cast):
    """The channel carries the node credentials' messages too (apps/nodes/credentials.py): they
    are not this cache's revocations, so a token read meanwhile is still kept."""
    _, key = cast["bob"]
    digest = digest_of(key)
    epoch = token_cache.CACHE.epoch
    token_cache.CACHE.drop(["node:n1", "credential:abc"])
    token = ApiToken.objects.select_related("user").get(digest=digest)
    token_cache.CACHE.put(digest, token, token.user, epoch=epoch)
    assert token_cache.CACHE.get(digest) is not None


def test_entries_live_at_most_the_setting(cast, settings, monkeypatch):
    _, key = cast["bob"]
    settings.TOKEN_CACHE_SECONDS = 5
    assert status(key) == 200
    digest = digest_of(key)
    assert token_cache.CACHE.get(digest) is not None
    later = time.monotonic() + 5
    monkeypatch.setattr(token_cache.time, "monotonic", lambda: later)
    assert token_cache.CACHE.get(digest) is None


def test_zero_turns_the_cache_off(cast, settings):
    _, key = cast["bob"]
    settings.TOKEN_CACHE_SECONDS = 0
    assert status(key) == 200
    with CaptureQueriesContext(connection) as second:
        assert status(key) == 200
    assert len(token_reads(second.captured_queries)) == 1


def test_after_a_lost_subscription_the_listener_comes_back_and_drops_the_whole_cache(cast):
    """Messages sent while it was away went unheard: every entry goes once it is back."""
    _, key = cast["bob"]
    assert status(key) == 200
    digest = digest_of(key)
    listener = token_cache.CACHE.listener
    assert token_cache.CACHE.get(digest) is not None

    shared_client().client_kill_filter(_type="pubsub")

    assert wait_until(lambda: not listener.subscribed.is_set(), 5)
    assert wait_until(listener.subscribed.is_set, 10)
    assert token_cache.CACHE.get(digest) is None


def test_a_user_made_staff_no_more_by_create_user_loses_staff_powers_at_once(cast):
    staff, key = cast["staff"]
    nodes = client_for(key).get("/api/v1/nodes/")
    assert nodes.status_code == 200
    user_create(username=staff.username, tenant_slug=None, token=None)
    assert client_for(key).get("/api/v1/nodes/").status_code == 403


def test_a_full_cache_makes_room_by_dropping_what_expired(cast, monkeypatch, settings):
    monkeypatch.setattr(token_cache, "MAX_ENTRIES", 2)
    keys = [cast[name][1] for name in ("alice", "bob", "carol")]
    assert status(keys[0]) == 200
    later = time.monotonic() + settings.TOKEN_CACHE_SECONDS
    monkeypatch.setattr(token_cache.time, "monotonic", lambda: later)
    assert status(keys[1]) == 200 and status(keys[2]) == 200
    assert set(token_cache.CACHE.entries) == {digest_of(keys[1]), digest_of(keys[2])}
