"""API tokens (apps/tenants/tokens.py): hashed at rest, named, several per user, expiring,
revocable; made and revoked by manage.py; DRF's clear-text tokens carried over by a migration."""

import hashlib
from datetime import timedelta
from io import StringIO

import pytest
from django.core.management import CommandError, call_command
from django.db import connection
from django.utils import timezone

from apps.tenants import token_cache
from apps.tenants.models import ApiToken
from apps.tenants.tokens import PREFIX, digest_of, token_issue, token_revoke, touch
from tests.factories import client_for


def ok(key) -> int:
    return client_for(key).get("/api/v1/usage/").status_code


def every_stored_value() -> str:
    """Every column of every row of the tokens tables, as the database holds them."""
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT * FROM {ApiToken._meta.db_table}")
        found = [str(value) for row in cursor.fetchall() for value in row]
        cursor.execute("SELECT * FROM authtoken_token")
        found += [str(value) for row in cursor.fetchall() for value in row]
    return "\n".join(found)


def test_a_token_is_not_in_the_database_in_clear(cast):
    bob, key = cast["bob"]
    assert key.startswith(PREFIX) and len(key) > 40  # a prefix secret scanners can match
    stored = every_stored_value()
    assert key not in stored and key[len(PREFIX) :] not in stored
    assert ApiToken.objects.get(user=bob).digest == hashlib.sha256(key.encode()).hexdigest()
    assert ok(key) == 200


def test_a_user_can_hold_two_and_revoke_one(cast):
    bob, first = cast["bob"]
    _, second = token_issue(user=bob, name="laptop")
    assert ok(first) == 200 and ok(second) == 200
    assert token_revoke(user=bob, name="laptop") == 1
    assert ok(second) == 401 and ok(first) == 200
    response = client_for(second).post("/api/v1/jobs/", {"template": "demo-train"}, format="json")
    assert response.status_code == 401 and response.json()["detail"] == "Token revoked."


def test_an_expired_token_gets_401_on_reads_and_submits(cast):
    bob, key = cast["bob"]
    ApiToken.objects.filter(user=bob).update(expires_at=timezone.now() - timedelta(seconds=1))
    for response in (
        client_for(key).get("/api/v1/jobs/"),
        client_for(key).post("/api/v1/jobs/", {}, format="json"),
    ):
        assert response.status_code == 401 and response.json()["detail"] == "Token expired."


def test_issuing_under_a_taken_name_replaces_that_token(cast):
    bob, key = cast["bob"]
    old = ApiToken.objects.get(user=bob)
    _, new = token_issue(user=bob, name=old.name)
    assert ok(key) == 401 and ok(new) == 200
    assert ApiToken.objects.filter(user=bob, revoked_at__isnull=True).count() == 1


def test_expiry_comes_from_the_setting_and_zero_means_never(cast, settings):
    bob = cast["bob"][0]
    settings.TOKEN_EXPIRY_DAYS = 7
    token, _ = token_issue(user=bob, name="week")
    assert timedelta(days=6) < token.expires_at - timezone.now() <= timedelta(days=7)
    assert token_issue(user=bob, name="forever", days=0)[0].expires_at is None


def test_last_use_is_written_at_most_once_a_minute(cast):
    bob, key = cast["bob"]
    token = ApiToken.objects.get(user=bob)
    touch(token)  # in its first minute: no write
    assert ApiToken.objects.get(pk=token.pk).last_used_at is None
    ApiToken.objects.filter(pk=token.pk).update(created_at=timezone.now() - timedelta(minutes=5))
    assert ok(key) == 200
    used = ApiToken.objects.get(pk=token.pk).last_used_at
    assert used is not None
    assert ok(key) == 200
    assert (
        ApiToken.objects.get(pk=token.pk).last_used_at == used
    )  # within the minute: not written again


def command(*args) -> list[str]:
    out = StringIO()
    call_command(*args, stdout=out)
    return out.getvalue().splitlines()


def test_create_user_token_prints_a_new_working_token_each_time(cast):
    first = command("create_user", "zed", "--tenant", "acme", "--token")[-1]
    second = command("create_user", "zed", "--tenant", "acme", "--token")[-1]
    assert first != second and first.startswith(PREFIX)
    assert ok(second) == 200 and ok(first) == 401  # the "cli" token rotated
    kept = command("create_user", "zed", "--tenant", "acme", "--token", "--token-name", "ci")[-1]
    assert ok(kept) == 200 and ok(second) == 200
    command("create_user", "zed", "--tenant", "acme")  # no --token: tokens untouched
    assert ok(kept) == 200


def test_revoke_token_by_name_and_all(cast):
    bob, key = cast["bob"]
    _, other = token_issue(user=bob, name="ci")
    assert command("revoke_token", "bob", "--name", "ci")[-1] == "revoked 1 token(s) of bob"
    assert ok(other) == 401 and ok(key) == 200
    with pytest.raises(CommandError, match="no active token named"):
        command("revoke_token", "bob", "--name", "ci")
    with pytest.raises(CommandError, match="--name NAME or --all"):
        command("revoke_token", "bob")
    with pytest.raises(CommandError, match="unknown user"):
        command("revoke_token", "nobody", "--all")
    token_issue(user=bob, name="ci")
    assert command("revoke_token", "bob", "--all")[-1] == "revoked 2 token(s) of bob"
    assert ok(key) == 401


def test_bootstrap_demo_prints_usable_tokens_on_every_run(db):
    for _ in range(2):
        lines = command("bootstrap_demo")
        keys = {line.split()[0]: line.split()[-1] for line in lines[1:-1]}
        assert set(keys) == {"alice", "bob", "carol", "dave", "erin", "staff"}
        assert all(
            ok(key) != 401 for key in keys.values()
        )  # staff: 403 on usage (no tenant), yet signed in
        assert ok(keys["bob"]) == 200


def demo_keys(*args) -> dict:
    lines = command("bootstrap_demo", *args)
    return {line.split()[0]: line.split()[-1] for line in lines[1:-1]}


def test_bootstrap_demo_keeps_its_tokens_under_the_data_dir_until_asked_to_rotate(
    db, settings, tmp_path
):
    """An exported GPUPLATFORM_TOKEN from one `make run` works in the next: the keys are kept in
    <data dir>/demo_tokens.json (this user's alone) and printed again; --rotate-tokens replaces
    them, and a kept key that no longer works (revoked, expired) is replaced on its own."""
    settings.DATA_DIR = tmp_path
    first = demo_keys()
    assert demo_keys() == first
    assert all(ok(key) != 401 for key in first.values()) and ok(first["bob"]) == 200
    kept = tmp_path / "demo_tokens.json"
    assert kept.stat().st_mode & 0o077 == 0
    assert ApiToken.objects.filter(user__username="bob", revoked_at__isnull=True).count() == 1
    rotated = demo_keys("--rotate-tokens")
    assert all(rotated[user] != first[user] for user in first)
    assert ok(first["bob"]) == 401 and ok(rotated["bob"]) == 200
    assert demo_keys() == rotated
    token_revoke(user=ApiToken.objects.get(digest=digest_of(rotated["erin"])).user, everything=True)
    again = demo_keys()
    assert again["erin"] != rotated["erin"] and ok(again["erin"]) == 200
    assert {user: key for user, key in again.items() if user != "erin"} == {
        user: key for user, key in rotated.items() if user != "erin"
    }


@pytest.mark.django_db(transaction=True)
def test_the_migration_hashes_drf_tokens_which_keep_working_until_they_expire(settings):
    """Back to before the tokens model, a clear DRF token, forward again: same key works, expires."""
    from django.contrib.auth.models import User
    from django.db.migrations.executor import MigrationExecutor

    executor = MigrationExecutor(connection)
    executor.migrate([("tenants", "0006_apitoken")])
    old = executor.loader.project_state(
        [("tenants", "0006_apitoken"), ("authtoken", "0003_tokenproxy")]
    ).apps
    user = old.get_model("auth", "User").objects.create(username="legacy")
    clear = "0123456789abcdef0123456789abcdef01234567"
    old.get_model("authtoken", "Token").objects.create(key=clear, user_id=user.pk)
    settings.MIGRATED_TOKEN_DAYS = 3
    executor = MigrationExecutor(connection)
    executor.loader.build_graph()
    executor.migrate(executor.loader.graph.leaf_nodes())
    token = ApiToken.objects.get(user__username="legacy")
    assert token.digest == digest_of(clear) and token.name == "migrated"
    assert timedelta(days=2) < token.expires_at - timezone.now() <= timedelta(days=3)
    assert clear not in every_stored_value()
    user = User.objects.get(username="legacy")
    assert client_for(clear).get("/api/v1/jobs/").status_code != 401
    ApiToken.objects.filter(pk=token.pk).update(expires_at=timezone.now())
    token_cache.CACHE.forget()  # an UPDATE by hand, which no revocation path makes
    assert client_for(clear).get("/api/v1/jobs/").status_code == 401
    user.delete()
