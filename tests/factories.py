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


def bulk_queued_jobs(count: int, **fields) -> None:
    """`count` queued jobs in a few statements, as many submits would leave them (each a new
    id, a name `bulk<i>` and a created_at one microsecond after the last); `fields` as for
    `Job(...)` (tenant, user, tier, template, gpus, gpu_sku, ...). Bypasses the ORM's per-row
    preparation: 50,000 rows take seconds, not a minute (tests and bench.queue_scale)."""
    import uuid
    from datetime import timedelta

    from django.db import connection, transaction
    from django.utils import timezone

    from apps.jobs.models import Job

    start = fields.pop("created_at", None) or timezone.now()
    proto = Job(name="bulk", created_at=start, **fields)
    columns = [f for f in Job._meta.concrete_fields]
    base = [f.get_db_prep_save(f.pre_save(proto, False), connection) for f in columns]
    at = {f.attname: i for i, f in enumerate(columns)}
    pk, created = columns[at["id"]], columns[at["created_at"]]
    sql = "INSERT INTO {} ({}) VALUES ({})".format(
        connection.ops.quote_name(Job._meta.db_table),
        ", ".join(connection.ops.quote_name(f.column) for f in columns),
        ", ".join(["%s"] * len(columns)),
    )
    rows = []
    for i in range(count):
        row = list(base)
        row[at["id"]] = pk.get_db_prep_save(uuid.uuid4(), connection)
        row[at["name"]] = f"bulk{i}"
        row[at["created_at"]] = created.get_db_prep_save(
            start + timedelta(microseconds=i), connection
        )
        rows.append(row)
    with transaction.atomic(), connection.cursor() as cursor:
        for begin in range(0, count, 5000):
            cursor.executemany(sql, rows[begin : begin + 5000])
