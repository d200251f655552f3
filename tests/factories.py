"""Plain helpers that make the cast of every test: alice (acme admin), bob (acme member),
carol (acme viewer), dave (globex, another tenant), staff (support)."""

from rest_framework.test import APIClient

from apps.nodes.models import Gpu, GpuSku, Node
from apps.tenants.defaults import ensure_defaults
from apps.tenants.services import tenant_create, user_create


def make_cast():
    ensure_defaults()
    tenant_create(slug="acme", tier_name="enterprise", allow_commands=True)
    tenant_create(slug="globex", tier_name="pro")
    people = {}
    for username, slug, role in [("alice", "acme", "admin"), ("bob", "acme", "member"), ("carol", "acme", "viewer"),
                                 ("dave", "globex", "member")]:  # fmt: skip
        user, token = user_create(username=username, tenant_slug=slug, role=role)
        people[username] = (user, token)
    people["staff"] = user_create(username="staff", tenant_slug=None, staff=True)
    return people


def client_for(token: str | None) -> APIClient:
    client = APIClient()
    if token:
        client.credentials(HTTP_AUTHORIZATION=f"Token {token}")
    return client


def make_node(name: str, sku: str = "H100-80GB", gpus: int = 8, labels: dict | None = None, *,
              isolation: str = "none", allow_unisolated_commands: bool = True) -> Node:  # fmt: skip
    """A registered node. Like the test agents it cannot isolate jobs, and the operator opted it
    in to jobs that run commands (tests of that rule pass allow_unisolated_commands=False)."""
    sku_row, _ = GpuSku.objects.get_or_create(name=sku)
    node = Node.objects.create(name=name, sku=sku_row, labels=labels or {}, isolation=isolation,
                               allow_unisolated_commands=allow_unisolated_commands)  # fmt: skip
    for index in range(gpus):
        Gpu.objects.create(node=node, index=index, uuid=f"GPU-{name}-{index}")
    return node
