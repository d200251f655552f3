"""Each web process's cache of node credentials (apps/nodes/credentials.py): a known credential
costs an agent request no statement, and a revoke reaches every process through the token
cache's Redis channel within 2 s; without that channel an entry lives TOKEN_CACHE_SECONDS."""

import time

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from apps.nodes import credentials
from apps.nodes.credentials import credential_node, issue_credential
from apps.nodes.models import NodeCredential
from apps.platform.redis import shared_client
from apps.tenants import token_cache
from tests.admission.test_token_cache import wait_until


@pytest.fixture(autouse=True)
def listening():
    """This process's listener subscribed (its first subscription drops every cache)."""
    token_cache.CACHE.listen()
    assert wait_until(token_cache.CACHE.listener.subscribed.is_set, 10)


def reads(captured) -> int:
    return sum("nodes_nodecredential" in q["sql"] for q in captured)


def reads_on_a_second_request() -> int:
    """A fresh credential used twice: the credential reads of the second use."""
    _, credential = issue_credential(node_name="n1")
    assert credential_node(credential) == "n1"
    with CaptureQueriesContext(connection) as second:
        assert credential_node(credential) == "n1"
    return reads(second.captured_queries)


def test_a_second_request_reads_nothing_for_its_credential(db):
    assert reads_on_a_second_request() == 0


def test_a_revoke_in_another_web_process_is_refused_here_within_2_s(db):
    """What another process's revoke sends once it commits (that commit is in its own
    connection: here the row is changed behind this process's back and the message alone must
    drop the entry)."""
    row, credential = issue_credential(node_name="n1")
    _, other = issue_credential(node_name="n2")
    assert credential_node(credential) == "n1" and credential_node(other) == "n2"
    NodeCredential.objects.filter(pk=row.pk).update(revoked_at=row.created_at)  # its commit
    assert credential_node(credential) == "n1"  # the kept row, until the message comes

    began = time.monotonic()
    shared_client().publish(token_cache.CHANNEL, "node:n1")

    assert wait_until(lambda: credential_node(credential) is None, 2.0)
    assert time.monotonic() - began < 2.0
    assert credential_node(other) == "n2"  # another node's is kept


def test_revoke_credentials_publishes_once_it_commits(db, django_capture_on_commit_callbacks):
    _, credential = issue_credential(node_name="n1")
    assert credential_node(credential) == "n1"
    heard = shared_client().pubsub()
    heard.subscribe(token_cache.CHANNEL)
    assert wait_until(lambda: heard.get_message(timeout=0.1) is not None)  # the subscribe
    with django_capture_on_commit_callbacks(execute=True):
        credentials.revoke_credentials(node_name="n1")
        assert credential_node(credential) is None  # this process at once

    def published():
        message = heard.get_message(timeout=0.1)
        return message is not None and message["data"] == b"node:n1"

    assert wait_until(published)
    heard.close()


def test_a_read_that_raced_a_revoke_is_not_kept(db):
    _, credential = issue_credential(node_name="n1")
    key_id = credential.removeprefix("gpn_").partition(".")[0]
    epoch = credentials.CACHE.epoch  # a request starts reading the row
    credentials.CACHE.drop(["node:n1"])  # a revoke is heard meanwhile
    row = credentials.Credential("n1", "sha", None, stored_at=time.monotonic())
    credentials.CACHE.put(key_id, row, epoch=epoch)
    assert credentials.CACHE.get(key_id) is None


def test_entries_live_at_most_the_token_cache_seconds(db, settings, monkeypatch):
    """The fallback while the channel is down: a revoke not heard still takes effect."""
    settings.TOKEN_CACHE_SECONDS = 5
    row, credential = issue_credential(node_name="n1")
    assert credential_node(credential) == "n1"
    NodeCredential.objects.filter(pk=row.pk).update(revoked_at=row.created_at)  # never heard
    assert credential_node(credential) == "n1"
    later = time.monotonic() + 5
    monkeypatch.setattr(credentials.time, "monotonic", lambda: later)
    assert credential_node(credential) is None


def test_zero_turns_the_cache_off(db, settings):
    settings.TOKEN_CACHE_SECONDS = 0
    assert reads_on_a_second_request() == 1


def test_a_credential_deleted_in_the_admin_is_refused_at_once(db):
    from django.contrib import admin

    row, credential = issue_credential(node_name="n1")
    assert credential_node(credential) == "n1"
    admin.site.get_model_admin(NodeCredential).delete_queryset(
        None, NodeCredential.objects.filter(pk=row.pk)
    )
    assert credential_node(credential) is None
