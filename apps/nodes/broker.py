"""Broker credentials for node agents (contract 2 of issue 16; helper "redis" owns the real one:
a Redis ACL user per node limited to its queue). This stand-in hands out the platform's URL."""

from django.conf import settings


def node_broker_url(node_name: str) -> str:
    """The broker URL a node's agent uses: its own ACL user limited to its queue (created or
    refreshed idempotently); where ACLs are unavailable, the platform's REDIS_URL."""
    return settings.REDIS_URL


def revoke_node_broker(node_name: str) -> None:
    """End the node's broker credential (nothing to end without ACLs)."""
