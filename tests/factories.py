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


def fast_insert(model, count: int, vary, **fields) -> None:
    """`count` rows of `model` in a few statements: `fields` (as for `model(...)`) prepared once,
    `vary(i)` -> {attname: value} prepared per row. Bypasses the ORM's per-row preparation of
    every field: 50,000 rows take seconds, not a minute (tests and bench.queue_scale)."""
    from django.db import connection, transaction

    proto = model(**fields)
    # An auto-increment key is the database's to fill in.
    columns = [f for f in model._meta.concrete_fields if not (f.primary_key and f.db_returning)]
    base = [f.get_db_prep_save(f.pre_save(proto, True), connection) for f in columns]
    at = {f.attname: i for i, f in enumerate(columns)}
    sql = "INSERT INTO {} ({}) VALUES ({})".format(
        connection.ops.quote_name(model._meta.db_table),
        ", ".join(connection.ops.quote_name(f.column) for f in columns),
        ", ".join(["%s"] * len(columns)),
    )
    with transaction.atomic(), connection.cursor() as cursor:
        for begin in range(0, count, 5000):
            rows = []
            for i in range(begin, min(count, begin + 5000)):
                row = list(base)
                for name, value in vary(i).items():
                    row[at[name]] = columns[at[name]].get_db_prep_save(value, connection)
                rows.append(row)
            cursor.executemany(sql, rows)


def bulk_queued_jobs(count: int, **fields) -> None:
    """`count` queued jobs as many submits would leave them: each a new id, the name `bulk<i>`
    and a created_at one microsecond after the last; `fields` as for `Job(...)`."""
    import uuid
    from datetime import timedelta

    from django.utils import timezone

    from apps.jobs.models import Job

    start = fields.pop("created_at", None) or timezone.now()

    def vary(i: int) -> dict:
        return {
            "id": uuid.uuid4(),
            "name": f"bulk{i}",
            "created_at": start + timedelta(microseconds=i),
        }

    fast_insert(Job, count, vary, name="bulk", created_at=start, **fields)


def park_node(gpus: int = 64, sku: str = "H100-80GB") -> Node:
    """A cordoned node of `gpus` GPUs: a job that big could run some day, so a submit of it is
    accepted (one no node could ever fit is a 400, apps/admission/fit.py), and it stays queued."""
    from apps.admission import fit
    from apps.nodes.models import NodeState

    node = make_node(f"parked-{gpus}", sku, gpus)
    Node.objects.filter(pk=node.pk).update(state=NodeState.CORDONED)
    fit.forget()
    return node
