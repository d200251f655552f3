"""The dispatcher's reads of every pass, written once and prepared on PostgreSQL.

Built by the ORM, each of these statements was compiled again on every pass (`as_sql`, the
lookups, the joins: ~13% of a draining pass's CPU, docs/bench/71-slurm-peer-notes.md, "h38disp
pass"), for reads of microseconds; and PostgreSQL parsed and planned each one again. Here each
is a string made once per backend from the models' metadata (tables and columns quoted by the
backend), its rows converted as the ORM converts them (the backend's and the field's
converters: `values_list`'s tuples, or `Reader`'s instances), and run on `prepared_cursor`: on
PostgreSQL a list of ids travels as one array parameter, so the text never changes and psycopg
prepares it (the server stops parsing and planning it); on SQLite it is `IN (...)`.
Each read gives what the ORM query it replaced gave, in the same order (tests/unit/
test_dispatch_reads.py compares them)."""

from __future__ import annotations

from functools import cache
from typing import Any, cast

from django.db import DEFAULT_DB_ALIAS, connection, connections
from django.db.models import Field, Model

from apps.jobs.models import GpuAllocation, Job, JobAttempt, JobTemplate
from apps.nodes.models import GpuSku, Node, NodeState
from apps.platform.db import Reader, among, column, convert, converters_of, prepared_cursor, table
from apps.tenants.models import Tenant, Tier

# What each read gives, named as `values_list` names them (kept.py reads them by position).
NODE_FIELDS = (
    "pk",
    "name",
    "sku__name",
    "labels",
    "state",
    "isolation",
    "allow_unisolated_commands",
)
ALLOCATION_FIELDS = ("pk", "attempt_id", "gpu_id", "attempt__version", "attempt__job__version")
ATTEMPT_FIELDS = (
    "pk", "state", "started_at", "created_at", "checkpoint_at", "preempted_for", "job_id",
    "job__state", "job__tenant__slug", "job__tenant__allow_commands", "job__tier__name",
    "job__tier__preemption_grace_seconds", "job__max_runtime_seconds", "job__preemption_count",
    "job__gpu_sku__name", "job__node_selector", "job__command", "job__user_id", "job__template_id",
    "job__image",
)  # fmt: skip
SPAN_FIELDS = ("pk", "job__tenant__slug", "job__tier__name", "started_at", "ended_at", "job__gpus",
               "job__nodes", "job__user_id", "job__template_id", "state")  # fmt: skip


def _quote(name: str) -> str:
    return connection.ops.quote_name(name)


class Columns:
    """Columns of a hand-written SELECT, named as `values_list` names them (`job__tier__name`
    from `alias_of`'s table aliases), and its rows converted as `values_list` converts them."""

    def __init__(self, model: type[Model], names: tuple[str, ...], aliases: dict[str, str]):
        """`aliases`: the table alias of each path of relations (`""` is `model`'s own,
        `"job__tier"` the job's tier), each joined by the statement."""
        sql, self.converters = [], []
        for index, name in enumerate(names):
            *path, attname = name.split("__")
            owner = model
            for step in path:
                owner = cast(Any, owner._meta.get_field(step)).related_model
            field = owner._meta.pk if attname == "pk" else owner._meta.get_field(attname)
            alias = aliases["__".join(path)]
            sql.append(f"{alias}.{_quote(cast(Field, field).column)}")
            found = converters_of(field, alias)
            if found[0]:
                self.converters.append((index, found))
        self.sql = ", ".join(sql)

    def rows(self, fetched: list[tuple]) -> list[tuple]:
        if not self.converters:
            return [tuple(row) for row in fetched]
        db, out = connections[DEFAULT_DB_ALIAS], []
        for row in fetched:
            values = list(row)
            for index, found in self.converters:
                values[index] = convert(values[index], found, db)
            out.append(tuple(values))
        return out


class _Reads:
    """The statements, for one backend."""

    def __init__(self, vendor: str, node_fields, allocation_fields, attempt_fields, span_fields):
        node, sku, gpu_alloc = table(Node), table(GpuSku), table(GpuAllocation)
        attempt, job, tenant, tier = table(JobAttempt), table(Job), table(Tenant), table(Tier)
        pk = _quote("id")

        self.tiers = Reader(Tier, "r")
        self.tier_sql = (
            f"SELECT {self.tiers.columns} FROM {tier} r ORDER BY r.{column(Tier, 'rank')} DESC"
        )

        self.nodes = Columns(Node, node_fields, {"": "n", "sku": "k"})
        lost = ", ".join(f"'{state.value}'" for state in (NodeState.LOST, NodeState.TERMINATED))
        self.node_sql = (
            f"SELECT {self.nodes.sql} FROM {node} n INNER JOIN {sku} k ON n.{column(Node, 'sku')} = k.{pk} "
            f"WHERE NOT (n.{column(Node, 'state')} IN ({lost})) ORDER BY n.{column(Node, 'name')} ASC"
        )  # fmt: skip

        self.allocations = Columns(GpuAllocation, allocation_fields,
                                   {"": "g", "attempt": "a", "attempt__job": "j"})  # fmt: skip
        self.allocation_sql = (
            f"SELECT {self.allocations.sql} FROM {gpu_alloc} g "
            f"INNER JOIN {attempt} a ON g.{column(GpuAllocation, 'attempt')} = a.{pk} "
            f"INNER JOIN {job} j ON a.{column(JobAttempt, 'job')} = j.{pk} "
            f"WHERE g.{column(GpuAllocation, 'released_at')} IS NULL"
        )

        # An attempt with its job, tenant, tier and SKU (JobAttempt's own order, as the ORM's).
        joined = {"": "a", "job": "j", "job__tenant": "t", "job__tier": "r", "job__gpu_sku": "k"}
        self.attempts = Columns(JobAttempt, attempt_fields, joined)
        self.attempt_sql = (
            f"SELECT {self.attempts.sql} FROM {attempt} a "
            f"INNER JOIN {job} j ON a.{column(JobAttempt, 'job')} = j.{pk} "
            f"INNER JOIN {tenant} t ON j.{column(Job, 'tenant')} = t.{pk} "
            f"INNER JOIN {tier} r ON j.{column(Job, 'tier')} = r.{pk} "
            f"LEFT OUTER JOIN {sku} k ON j.{column(Job, 'gpu_sku')} = k.{pk} WHERE "
        )
        self.attempt_order = (
            f" ORDER BY j.{column(Job, 'created_at')} DESC, a.{column(JobAttempt, 'number')} ASC"
        )
        self.attempt_id = f"a.{pk}"
        self.held_attempts = (
            f"a.{pk} IN (SELECT u.{column(GpuAllocation, 'attempt')} FROM {gpu_alloc} u "
            f"WHERE u.{column(GpuAllocation, 'released_at')} IS NULL)"
        )

        self.spans = Columns(JobAttempt, span_fields,
                             {"": "a", "job": "j", "job__tenant": "t", "job__tier": "r"})  # fmt: skip
        started, ended = (
            f"a.{column(JobAttempt, 'started_at')}",
            f"a.{column(JobAttempt, 'ended_at')}",
        )
        self.span_sql = (
            f"SELECT {self.spans.sql} FROM {attempt} a "
            f"INNER JOIN {job} j ON a.{column(JobAttempt, 'job')} = j.{pk} "
            f"INNER JOIN {tenant} t ON j.{column(Job, 'tenant')} = t.{pk} "
            f"INNER JOIN {tier} r ON j.{column(Job, 'tier')} = r.{pk} WHERE {started} IS NOT NULL AND "
        )  # fmt: skip
        self.ended = ended
        self.live_sql = (
            f"SELECT a.{pk} FROM {attempt} a WHERE {started} IS NOT NULL AND {ended} IS NULL"
        )

        self.readers: dict[type[Model], Reader] = {
            model: Reader(model, "x") for model in (Tenant, GpuSku, JobTemplate)
        }
        self.jobs = Reader(Job, "j")
        self.job_sql = f"SELECT {self.jobs.columns} FROM {job} j WHERE "


@cache
def _reads(vendor: str) -> _Reads:
    return _Reads(vendor, NODE_FIELDS, ALLOCATION_FIELDS, ATTEMPT_FIELDS, SPAN_FIELDS)


_ATTEMPT_PK = cast(Field, JobAttempt._meta.pk)


def _fetch(sql: str, params: list) -> list[tuple]:
    with prepared_cursor() as cursor:
        cursor.execute(sql, params)
        return cursor.fetchall()


def tier_rows() -> list[Tier]:
    """Every tier, best rank first (Tier's own order), as `Tier.objects.all()` gives them."""
    reads = _reads(connection.vendor)
    db = connections[DEFAULT_DB_ALIAS]
    return [cast(Tier, reads.tiers.build(row, db)) for row in _fetch(reads.tier_sql, [])]


def node_rows() -> list[tuple]:
    """The nodes not lost or terminated, by name: `NODE_FIELDS` of each."""
    reads = _reads(connection.vendor)
    return reads.nodes.rows(_fetch(reads.node_sql, []))


def allocation_rows() -> list[tuple]:
    """The held GPU allocations: `ALLOCATION_FIELDS` of each."""
    reads = _reads(connection.vendor)
    return reads.allocations.rows(_fetch(reads.allocation_sql, []))


def attempt_rows(ids: list[int] | None) -> list[tuple]:
    """`ATTEMPT_FIELDS` of the attempts `ids` (None: of every attempt holding a GPU), in
    JobAttempt's order (its job's submit, latest first, then its number)."""
    reads = _reads(connection.vendor)
    if ids is None:
        where, params = reads.held_attempts, cast(list, [])
    else:
        where, params = among(reads.attempt_id, _ATTEMPT_PK, ids)
    return reads.attempts.rows(_fetch(f"{reads.attempt_sql}{where}{reads.attempt_order}", params))


def span_rows(*, since=None, ended_after=None, known: list[int] | None = None,
              also: list[int] | None = None) -> list[tuple]:  # fmt: skip
    """`SPAN_FIELDS` of the attempts that started and either run still or ended at or
    after `since` (UsageSpans' first read); or, with `ended_after`, that ended at or after it
    and are not among `known`, or are among `also` (a refresh)."""
    reads = _reads(connection.vendor)
    moment = connection.ops.adapt_datetimefield_value
    if since is not None:
        where, params = f"({reads.ended} IS NULL OR {reads.ended} >= %s)", [moment(since)]
    else:
        where, params = f"{reads.ended} >= %s", [moment(ended_after)]
        if known:
            sql, values = among(reads.attempt_id, _ATTEMPT_PK, known)
            where, params = f"{where} AND NOT ({sql})", [*params, *values]
        if also:
            sql, values = among(reads.attempt_id, _ATTEMPT_PK, also)
            where, params = f"(({where}) OR {sql})", [*params, *values]
    return reads.spans.rows(_fetch(reads.span_sql + where, params))


def live_attempt_ids() -> list[int]:
    """The ids of the attempts that started and have not ended."""
    return [row[0] for row in _fetch(_reads(connection.vendor).live_sql, [])]


def rows_by_id(model: type[Model], ids) -> dict[int, Model]:
    """`model.objects.in_bulk(ids)` for Tenant, GpuSku and JobTemplate: {id: instance}."""
    reads = _reads(connection.vendor)
    reader = reads.readers[model]
    where, params = among(f"x.{_quote('id')}", cast(Field, model._meta.pk), sorted(ids))
    db = connections[DEFAULT_DB_ALIAS]
    rows = _fetch(f"SELECT {reader.columns} FROM {table(model)} x WHERE {where}", params)
    found = (reader.build(row, db) for row in rows)
    return {instance.pk: instance for instance in found if instance is not None}


def jobs_by_id(ids: list) -> dict:
    """{id: Job} of the jobs `ids` (their UUIDs), every column read: the heads that are new or
    changed since the last pass (dispatcher._heads_kept_or_read), as `Job.objects.raw` built them."""
    reads = _reads(connection.vendor)
    where, params = among(f"j.{_quote('id')}", cast(Field, Job._meta.pk), ids)
    db = connections[DEFAULT_DB_ALIAS]
    found = (reads.jobs.build(row, db) for row in _fetch(f"{reads.job_sql}{where}", params))
    return {job.pk: job for job in found if job is not None}
