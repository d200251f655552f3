"""The submit path's statements, written once instead of built by the ORM on every request.

A submit runs about ten statements. Building each through the ORM (filters, joins, the
compiler, model instances) cost 0.3-0.6 ms of CPU, more than the database took to run it, and
made a submit cost 4-5x a minimal authenticated request (docs/admission.md, "Throughput").
Here each statement's SQL is written once from the models' metadata (table and column names,
quoted by the backend, so it follows the migrations and runs on SQLite and PostgreSQL alike);
values go through the fields' own conversions both ways (`pre_save` and `get_db_prep_save`
in, the backend's and the field's converters out), and rows become model instances through
`Model.from_db`, as the ORM builds them. tests/admission/test_rows.py checks every field of
what these read and write against the ORM's own reads.

Public APIs only (scripts/check_private_names.py, in `make lint`, keeps it so): the statements
run on Django's own cursor (`connection.cursor()`), related objects are attached through the
relations' descriptors, and an inserted row is rebuilt through `Model.from_db` rather than
marked saved by hand. Queue order comes from apps/jobs/queue_order.py.
"""

from __future__ import annotations

import uuid
from datetime import UTC, datetime
from functools import cache
from typing import TYPE_CHECKING, TypeVar

from django.contrib.auth import get_user_model
from django.db import DEFAULT_DB_ALIAS, connection, connections
from django.db.models import AutoField, BigAutoField, ForeignKey, Model

from apps.admission.models import QueuedCount
from apps.jobs import queue_order
from apps.jobs.models import Job, JobArray, JobEvent, JobTemplate
from apps.nodes.models import GpuSku
from apps.platform.db import (
    NumberedStatement,
    Reader,
    column,
    convert,
    converters_of,
    prepared_cursor,
    table,
)
from apps.tenants.models import ApiToken, Membership, Quota, Tenant, Tier

if TYPE_CHECKING:
    from django.contrib.auth.models import User

EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
M = TypeVar("M", bound=Model)


def _q(name: str) -> str:
    return connection.ops.quote_name(name)


def _db():
    """This thread's connection itself: each attribute read through `django.db.connection` (a
    proxy) looks the thread's connection up again, ~2 us, and a submit made dozens."""
    return connections[DEFAULT_DB_ALIAS]


_PLAIN = {"CharField", "SlugField", "TextField", "BooleanField", "FloatField", "IntegerField",
          "SmallIntegerField", "BigIntegerField", "PositiveIntegerField", "PositiveSmallIntegerField",
          "PositiveBigIntegerField", "AutoField", "BigAutoField"}  # fmt: skip


def _plain(field) -> bool:
    """True when the field's value goes to the database as the model holds it."""
    if field.is_relation:  # a foreign key holds its target's value
        return field.target_field.get_internal_type() in _PLAIN
    if getattr(field, "auto_now", False) or getattr(field, "auto_now_add", False):
        return False
    return field.get_internal_type() in _PLAIN


class Inserter:
    """INSERT of one instance of `model`, every column (an auto primary key left to the database)."""

    def __init__(self, model: type[Model]):
        self.fields = [
            f for f in model._meta.concrete_fields if not isinstance(f, AutoField | BigAutoField)
        ]
        columns = ", ".join(_q(f.column) for f in self.fields)
        marks = ", ".join(["%s"] * len(self.fields))
        self.sql = f"INSERT INTO {table(model)} ({columns}) VALUES ({marks})"
        # Each field's own conversion (`get_db_prep_save`), except where it would change nothing:
        # integers, strings, booleans, floats and foreign keys to integer keys are already what
        # the database takes (~0.1 ms of a submit's two inserts otherwise).
        self.preps = [(f, None if _plain(f) else f.get_db_prep_save) for f in self.fields]

    def gated(self, source: str) -> str:
        """The same INSERT of one row for each row of `source` (one or none), as
        `INSERT ... SELECT <values> FROM source`."""
        columns, marks = self.sql.split(" VALUES (")
        return f"{columns} SELECT {marks[:-1]} FROM {source}"

    def params(self, instance: Model) -> list:
        db = _db()
        return [
            prep(field.pre_save(instance, True), db) if prep else getattr(instance, field.attname)
            for field, prep in self.preps
        ]


def _saved(instance: M) -> M:
    """The row just inserted, as the ORM's save() leaves it: built again through the documented
    `Model.from_db` (so no longer "adding"), with the related objects the original had in hand."""
    model = type(instance)
    fields = model._meta.concrete_fields
    saved = model.from_db(
        DEFAULT_DB_ALIAS,
        [f.attname for f in fields],
        [getattr(instance, f.attname) for f in fields],
    )
    for field in fields:
        if isinstance(field, ForeignKey) and field.is_cached(instance):
            setattr(saved, field.name, getattr(instance, field.name))
    return saved


# One set of statements per backend (the test suite may switch between SQLite and PostgreSQL).


@cache
def _statements(vendor: str) -> dict:
    m, t, r, q = (
        Reader(Membership, "m"),
        Reader(Tenant, "t"),
        Reader(Tier, "r"),
        Reader(Quota, "q"),
    )
    job, tier = Job._meta, Tier._meta

    named_template, named_sku = Reader(JobTemplate, "x"), Reader(GpuSku, "k")
    submitter = (
        f"SELECT {m.columns}, {t.columns}, {r.columns}, {q.columns}, {named_template.columns}, {named_sku.columns} "
        f"FROM {table(Membership)} {_q('m')} "
        f"INNER JOIN {table(Tenant)} {_q('t')} ON {_q('m')}.{column(Membership, 'tenant')} = {_q('t')}.{column(Tenant, 'id')} "
        f"INNER JOIN {_q(tier.db_table)} {_q('r')} ON {_q('t')}.{column(Tenant, 'tier')} = {_q('r')}.{column(Tier, 'id')} "
        f"LEFT OUTER JOIN {table(Quota)} {_q('q')} ON {_q('q')}.{column(Quota, 'tenant')} = {_q('t')}.{column(Tenant, 'id')} "
        # The template and the SKU the body names, if any (validation needs them: two fewer
        # statements, each a round trip on PostgreSQL).
        f"LEFT OUTER JOIN {table(JobTemplate)} {_q('x')} ON {_q('x')}.{column(JobTemplate, 'name')} = %s "
        f"LEFT OUTER JOIN {table(GpuSku)} {_q('k')} ON {_q('k')}.{column(GpuSku, 'name')} = %s "
        f"WHERE {_q('m')}.{column(Membership, 'user')} = %s"
    )  # fmt: skip
    # An API token (found by its key's digest: apps/tenants/tokens.py) with its user,
    # and for a submit, in the same statement, all that `submitter` reads: the membership
    # (none: the user belongs to no tenant, and every column of the rest is NULL too).
    User = get_user_model()
    token, user, user_pk = Reader(ApiToken, "tk"), Reader(User, "u"), _q(User._meta.pk.column)
    token_user = (
        f"SELECT {token.columns}, {user.columns} FROM {table(ApiToken)} {_q('tk')} "
        f"INNER JOIN {table(User)} {_q('u')} ON {_q('tk')}.{column(ApiToken, 'user')} = {_q('u')}.{user_pk}"
    )
    token_submitter = (
        f"SELECT {token.columns}, {user.columns}, {m.columns}, {t.columns}, {r.columns}, {q.columns}, "
        f"{named_template.columns}, {named_sku.columns} FROM {table(ApiToken)} {_q('tk')} "
        f"INNER JOIN {table(User)} {_q('u')} ON {_q('tk')}.{column(ApiToken, 'user')} = {_q('u')}.{user_pk} "
        f"LEFT OUTER JOIN {table(Membership)} {_q('m')} ON {_q('m')}.{column(Membership, 'user')} = {_q('u')}.{user_pk} "
        f"LEFT OUTER JOIN {table(Tenant)} {_q('t')} ON {_q('m')}.{column(Membership, 'tenant')} = {_q('t')}.{column(Tenant, 'id')} "
        f"LEFT OUTER JOIN {_q(tier.db_table)} {_q('r')} ON {_q('t')}.{column(Tenant, 'tier')} = {_q('r')}.{column(Tier, 'id')} "
        f"LEFT OUTER JOIN {table(Quota)} {_q('q')} ON {_q('q')}.{column(Quota, 'tenant')} = {_q('t')}.{column(Tenant, 'id')} "
        f"LEFT OUTER JOIN {table(JobTemplate)} {_q('x')} ON {_q('x')}.{column(JobTemplate, 'name')} = %s "
        f"LEFT OUTER JOIN {table(GpuSku)} {_q('k')} ON {_q('k')}.{column(GpuSku, 'name')} = %s "
        f"WHERE {_q('tk')}.{column(ApiToken, 'digest')} = %s"
    )  # fmt: skip
    counts, counted = table(QueuedCount), column(QueuedCount, "queued")
    counts_tenant = column(QueuedCount, "tenant")
    jobs, events = Inserter(Job), Inserter(JobEvent)
    state, tier_id, created = column(Job, "state"), column(Job, "tier"), column(Job, "created_at")
    # Jobs held by their dependencies are queued but wait for no GPU: no queue position counts
    # them (docs/pipelines.md). The queue's index does not hold the flag: these counts read the
    # rows of the queued jobs too.
    unheld = f"{column(Job, 'held_by_dependencies')} = {'false' if vendor == 'postgresql' else '0'}"
    in_queue_order = queue_order.order_sql(
        {
            "tier__level": f"r.{column(Tier, 'level')}",
            "tier__rank": f"r.{column(Tier, 'rank')}",
            "created_at": f"j.{created}",
        }
    )
    since_count = (
        f"(SELECT COUNT(*) FROM {_q(job.db_table)} j WHERE j.{state} = %s AND j.{unheld} AND j.{tier_id} = r.{column(Tier, 'id')} "
        f"AND j.{created} > %s"
    )  # left open: the second count adds its upper bound
    queue_select = (
        f"SELECT j.{column(Job, 'id')}, s.{column(GpuSku, 'name')}, j.{column(Job, 'gpus')}, j.{column(Job, 'nodes')}, "
        f"j.{column(Job, 'max_runtime_seconds')}, j.{column(Job, 'template')}, r.{column(Tier, 'level')}, r.{column(Tier, 'rank')}, "
        f"j.{created}, j.{column(Job, 'held_by_dependencies')} FROM {_q(job.db_table)} j INNER JOIN {_q(tier.db_table)} r ON j.{tier_id} = r.{column(Tier, 'id')} "
        f"LEFT OUTER JOIN {table(GpuSku)} s ON j.{column(Job, 'gpu_sku')} = s.{column(GpuSku, 'id')}"
    )
    return {
        "readers": (m, t, r, q, named_template, named_sku),
        "submitter": submitter,
        "token_readers": (token, user),
        "token_user": f"{token_user} WHERE {_q('tk')}.{column(ApiToken, 'digest')} = %s",
        "token_submitter": token_submitter,
        # The same template and SKU on their own (a submit that did not name them with the
        # membership: the web form), with the same readers.
        "template": (
            named_template,
            f"SELECT {named_template.columns} FROM {table(JobTemplate)} {_q('x')} "
            f"WHERE {_q('x')}.{column(JobTemplate, 'name')} = %s",
        ),  # fmt: skip
        "sku": (
            named_sku,
            f"SELECT {named_sku.columns} FROM {table(GpuSku)} {_q('k')} "
            f"WHERE {_q('k')}.{column(GpuSku, 'name')} = %s",
        ),  # fmt: skip
        # The tenant's queued jobs as the jobs table's triggers keep them (apps/admission/queued.py).
        "queued_kept": f"SELECT {counted} FROM {counts} WHERE {counts_tenant} = %s",
        # NO KEY UPDATE: it orders the tenant's submits, but lets the foreign-key checks of
        # other transactions' inserts (FOR KEY SHARE of the tenant) through. FOR UPDATE would
        # block them, and a one-statement submit holding the tenant's count row while its check
        # waited on a locked submit waiting for that row would deadlock.
        "lock_tenant": f"SELECT {column(Tenant, 'id')} FROM {table(Tenant)} WHERE {column(Tenant, 'id')} = %s FOR NO KEY UPDATE",
        # Per tier (with its level and rank), the queued jobs and those submitted before a
        # time: one pass over the (state, tier, created_at) index, no job row read; which tiers
        # are ahead is queue order's to say (apps/jobs/queue_order.py, `queued_and_ahead`).
        "queued_per_tier": (
            f"SELECT r.{column(Tier, 'level')}, r.{column(Tier, 'rank')}, c.n, c.n_before FROM (SELECT {tier_id} AS tier, "
            f"COUNT(*) AS n, SUM(CASE WHEN {created} < %s THEN 1 ELSE 0 END) AS n_before FROM {_q(job.db_table)} "
            f"WHERE {state} = %s AND {unheld} GROUP BY {tier_id}) c INNER JOIN {_q(tier.db_table)} r ON r.{column(Tier, 'id')} = c.tier"
        ),  # fmt: skip
        # A long queue's counts per tier (a web thread loads them at most once a second), and the
        # jobs queued since (the (state, created_at) index from the newest one counted).
        "queued_by_tier": f"SELECT {tier_id}, COUNT(*), MAX({created}) FROM {_q(job.db_table)} WHERE {state} = %s AND {unheld} GROUP BY {tier_id}",
        # Per tier, two ranges of the (state, tier, created_at) index: O(tiers + jobs since).
        # (A GROUP BY tier over `created_at > %s` makes SQLite walk the whole queue in that
        # index's order, for the grouping, instead.)
        "queued_since": (
            f"SELECT r.{column(Tier, 'id')}, {since_count}), {since_count} AND j.{created} < %s) "
            f"FROM {_q(tier.db_table)} r"
        ),
        # The queue in queue order (apps/jobs/queue_order.py) as the start estimate's replay reads
        # it (estimates.queued_row's arguments): the first jobs up to a limit, or those queued since a time.
        "queue": f"{queue_select} WHERE j.{state} = %s ORDER BY {in_queue_order} LIMIT %s",
        # The same, plus (one more row, its id NULL) how many jobs are queued in all, from
        # the tenants' kept counts: one statement, so both come from one snapshot of the queue,
        # and neither grows with it (the total was a count of the queue).
        # On PostgreSQL the jobs an earlier window returned are left out here (an array of
        # their ids), not converted and dropped: `queue_window`.
        "queue_window": (
            f"{queue_select} WHERE j.{state} = %s AND j.{created} >= %s "
            f"{'AND NOT (j.' + column(Job, 'id') + ' = ANY(%s::uuid[])) ' if vendor == 'postgresql' else ''}UNION ALL "
            f"SELECT NULL, NULL, COALESCE(SUM({counted}), 0), NULL, NULL, NULL, NULL, NULL, NULL, NULL FROM {counts}"
        ),
        "queue_converters": [
            converters_of(Job._meta.pk, "j"),
            converters_of(Job._meta.get_field("created_at"), "j"),
        ],
        "tiers": f"SELECT {column(Tier, 'id')}, {column(Tier, 'level')}, {column(Tier, 'rank')} FROM {_q(tier.db_table)}",
        "job": jobs,
        "event": events,
    }


def statements() -> dict:
    return _statements(_db().vendor)


def _cursor():
    """Django's own cursor (`connection.cursor()`): its placeholders, error translation,
    broken-transaction guard and statement recording, on every backend."""
    return _db().cursor()


def _one(sql: str, params: list, *, prepared: bool = False):
    """The first row of `sql`, or None; `prepared`: on `_prepared_cursor`."""
    with _prepared_cursor() if prepared else _cursor() as cursor:
        cursor.execute(sql, params)
        return cursor.fetchone()


def _prepared_cursor():
    """apps/platform/db.py's server-binding cursor (prepared on PostgreSQL once run a few times)
    for the lookups every request makes (the token's, the submitter's), the submit's one
    statement (`_admit`) and the queue window every submit's answer reads (`queue_window`).
    Django's cursor elsewhere: its client-side binding sends a transaction's lock and count as
    one query string (`_after_lock`), which a prepared statement cannot be."""
    return prepared_cursor(_db())


def membership_of(
    user, *, template: str | None = None, sku: str | None = None
) -> Membership | None:
    """The user's membership with its tenant, the tenant's tier and quota, as
    `Membership.objects.select_related("tenant__tier", "tenant__quota")` would give it, and in
    the same statement the template and the SKU of these names: `membership.named` is
    {("template", name): JobTemplate or None, ("sku", name): GpuSku or None} for the names given."""
    s = statements()
    row = _one(s["submitter"], [template, sku, user.pk], prepared=True)
    if row is None:
        return None
    return _membership(_built(s["readers"], row), template=template, sku=sku)


def _built(readers, row) -> list:
    """Each reader's instance from its slice of `row`, in order."""
    parts, start = [], 0
    for reader in readers:
        parts.append(reader.build(row[start : start + reader.width]))
        start += reader.width
    return parts


def _membership(parts: list, *, template: str | None, sku: str | None) -> Membership | None:
    membership, tenant, tier, quota, named_template, named_sku = parts
    if membership is None:
        return None
    # The relations' own descriptors: they remember the related object on both sides, as
    # select_related leaves them.
    membership.tenant, tenant.tier = tenant, tier
    if quota is not None:
        tenant.quota = quota
    membership.named = {}
    if template is not None:
        membership.named["template", template] = named_template
    if sku is not None:
        membership.named["sku", sku] = named_sku
    return membership


def token_user(digest: str) -> tuple[ApiToken, object] | None:
    """The token of this key digest and its user, as `ApiToken.objects.select_related("user")`
    gives them (revoked and expired ones too: the caller says why it refuses them)."""
    s = statements()
    row = _one(s["token_user"], [digest], prepared=True)
    return None if row is None else _token_and_user(_built(s["token_readers"], row))


def token_submitter(digest: str, *, template: str | None = None, sku: str | None = None):
    """(token, user, membership as `membership_of` gives it, or None) for this key digest, in one
    statement; None where no token has it."""
    s = statements()
    row = _one(s["token_submitter"], [template, sku, digest], prepared=True)
    if row is None:
        return None
    readers = s["token_readers"]
    token, user = _token_and_user(_built(readers, row))
    membership = _membership(
        _built(s["readers"], row[sum(r.width for r in readers) :]), template=template, sku=sku
    )
    if membership is not None:
        membership.user = user
    return token, user, membership


def _token_and_user(parts: list) -> tuple[ApiToken, User]:
    token, user = parts
    token.user = user
    return token, user


def _named(kind: str, name: str):
    reader, sql = statements()[kind]
    row = _one(sql, [name])
    return None if row is None else reader.build(row)


def template_named(name: str) -> JobTemplate | None:
    return _named("template", name)


def sku_named(name: str) -> GpuSku | None:
    return _named("sku", name)


def lock_tenant(tenant: Tenant) -> None:
    """PostgreSQL: the tenant's row lock (SELECT ... FOR NO KEY UPDATE) for the rest of the transaction."""
    _one(statements()["lock_tenant"], [tenant.pk])


def queued_kept(tenant: Tenant) -> int | None:
    """The tenant's queued jobs as kept by the triggers; None where it has no row (none ever
    queued). Unlocked: the queued-job cap's reads are `queued_for_cap`'s and `admit`'s."""
    row = _one(statements()["queued_kept"], [tenant.pk])
    return None if row is None else row[0]


def _saved_pair(job: Job, event: JobEvent) -> tuple[Job, JobEvent]:
    job = _saved(job)
    event = _saved(event)
    event.job = job
    return job, event


def _moment(value: datetime):
    """A time as the database compares it with created_at."""
    return Job._meta.get_field("created_at").get_db_prep_value(value, _db())


def queued_and_ahead(job: Job) -> tuple[int, int]:
    """(jobs queued, jobs queued ahead of `job` in queue order)."""
    mine = queue_order.tier_key(job.tier.level, job.tier.rank)
    total = ahead = 0
    for level, rank, n, n_before in _all(
        statements()["queued_per_tier"], [_moment(job.created_at), "queued"]
    ):
        theirs = queue_order.tier_key(level, rank)
        total += n
        if theirs < mine:
            ahead += n
        elif theirs == mine:  # the same place in the order: those submitted earlier
            ahead += int(n_before or 0)
    return total, ahead


def _all(sql: str, params: list, *, prepared: bool = False) -> list[tuple]:
    with _prepared_cursor() if prepared else _cursor() as cursor:
        cursor.execute(sql, params)
        return cursor.fetchall()


def queued_by_tier() -> list[tuple]:
    """[(tier id, jobs queued, the newest one's created_at as the database gives it back)]."""
    return _all(statements()["queued_by_tier"], ["queued"])


def queued_since(newest, before) -> dict:
    """{tier id: (jobs queued after `newest`, of which created before `before`)}; `newest` as
    `queued_by_tier` gave it (None: since the start)."""
    if newest is None:
        newest = _moment(EPOCH)
    found = _all(
        statements()["queued_since"], ["queued", newest, "queued", newest, _moment(before)]
    )  # a row a tier
    return {tier: (n, n_before) for tier, n, n_before in found if n}


def queue(limit: int) -> list[tuple]:
    """The first `limit` queued jobs in queue order, as estimates.queued_row's arguments."""
    s = statements()
    return _queue_rows(_all(s["queue"], ["queued", limit]), s)


def queue_window(moment, seen: dict | None = None) -> tuple[list[tuple], int, dict]:
    """From one snapshot of the queue: the queued jobs created at `moment` or later, as
    estimates.queued_row's arguments, except those whose ids are in `seen` (what this function
    returned last); how many jobs are queued in all; and `seen` for the next window. A busy
    queue's window holds many jobs the previous one already returned, and converting their ids
    and times only to drop them was most of its cost. On PostgreSQL the statement leaves them
    out (their ids as one array parameter), and `seen` is {id: created_at} of the jobs returned,
    kept while created at `moment` or later (a job of it that left the queue meanwhile stays
    until then: the caller notices its leaving by the total). On SQLite they are dropped after
    the read, before their conversion, and `seen` holds the window's ids as read. Every
    submit's answer runs it: prepared on PostgreSQL (`_prepared_cursor`), which took a third off
    the server's CPU for a submit (1.3 to 1.0 ms, docs/bench/71-slurm-peer-notes.md, fourth
    pass)."""
    s, seen = statements(), seen or {}
    params = ["queued", _moment(moment)]
    leaves_out = _db().vendor == "postgresql"
    if leaves_out:
        params.append(uuid_array(seen))
    found = _all(s["queue_window"], params, prepared=True)
    total = next(row[2] for row in found if row[0] is None)
    found = [row for row in found if row[0] is not None]
    if not leaves_out:  # the window's ids as the database gives them back, for the next
        new = _queue_rows([row for row in found if row[0] not in seen], s)
        return new, int(total), dict.fromkeys(row[0] for row in found)
    new = _queue_rows(found, s)
    kept = {pk: created for pk, created in seen.items() if created >= moment}
    kept.update((row[0], row[8]) for row in new)
    return new, int(total), kept


def uuid_array(ids) -> str:
    """PostgreSQL's text form of a `uuid[]` (`{id,id,...}`), for a parameter the statement casts
    (`%s::uuid[]`). A UUID's canonical text (hex digits and dashes) needs no quoting in an array
    literal. psycopg dumps a list of UUIDs element by element in Python, ~1.7 us an id (58 us for
    the ~30 a busy queue window leaves out); the joined text is one string parameter, ~0.1 us
    an id. `ids`: UUIDs (str() gives the canonical form)."""
    return "{" + ",".join(map(str, ids)) + "}"


def _queue_rows(found: list[tuple], s: dict) -> list[tuple]:
    """The id as a UUID and created_at aware, as the ORM gives them back. The fields' converters
    (`convert`) cost ~8 us a row (a settings lookup and `make_aware` each), most of loading a
    1,000-job queue, so the two conversions are done here directly; test_rows.py compares."""
    if not found:
        return []
    db = _db()
    zone = db.timezone
    pk, created = found[0][0], found[0][8]
    to_uuid = isinstance(pk, str)
    naive = isinstance(created, datetime) and created.tzinfo is None
    if not to_uuid and not naive and isinstance(created, datetime):
        return found  # PostgreSQL: already a UUID and an aware datetime
    pk_conv, created_conv = s["queue_converters"]
    out = []
    for row in found:
        when = row[8]
        if naive:
            when = when.replace(tzinfo=zone)
        elif not isinstance(when, datetime):
            when = convert(when, created_conv, db)
        out.append(
            (
                uuid.UUID(row[0]) if to_uuid else convert(row[0], pk_conv, db),
                *row[1:8],
                when,
                *row[9:],
            )
        )
    return out


def tiers() -> dict:
    """{tier id: (level, rank)}."""
    return {pk: (level, rank) for pk, level, rank in _all(statements()["tiers"], [])}


def insert_params(job: Job, event: JobEvent) -> tuple[list, list]:
    """The INSERT parameters of a new job and its event. A submit works them out before it
    takes its lock (SQLite: the one write turn of every web process), which it then holds for
    the statements alone."""
    s = statements()
    return s["job"].params(job), s["event"].params(event)


def insert_job_and_event(
    job: Job, event: JobEvent, params: tuple[list, list] | None = None
) -> tuple[Job, JobEvent]:
    """Both rows (`params`: insert_params' for them); on PostgreSQL in one statement (a
    data-modifying WITH: one round trip). Returns them as saved (`_saved`)."""
    s = statements()
    job_params, event_params = params or insert_params(job, event)
    with _cursor() as cursor:
        if _db().vendor == "postgresql":
            cursor.execute(
                f"WITH new_job AS ({s['job'].sql}) {s['event'].sql}", job_params + event_params
            )
        else:
            cursor.execute(s["job"].sql, job_params)
            cursor.execute(s["event"].sql, event_params)
    return _saved_pair(job, event)


# --- the queued-job cap --------------------------------------------------------------------------
#
# A tenant's queue is its queued jobs (the kept count, apps/admission/queued.py) and its arrays'
# virtual tasks (apps/admission/arrays.py). Whatever adds to either holds the tenant's count row
# until it commits: a job's insert moves the count, and an array comes with its first task's row.
# So the cap's check takes that row's lock first and counts only then, in a statement of its own:
# under READ COMMITTED a statement sees the database as it was when the statement began, and one
# that waited for the lock and counted in one go would miss what the submit it waited for had
# committed meanwhile (its array: the locked count row is read again after the wait, the arrays
# table is not). In a transaction both statements go in one query string, one round trip
# (`_after_lock`). Outside one (`admit`), PostgreSQL's `gpuplatform_queue_room` function does the
# two (apps/admission/migrations/0004: each statement of a VOLATILE function takes a fresh
# snapshot), so the lock, the check and the inserts are one statement, prepared on the server
# (`NumberedStatement`, bound as on `_prepared_cursor`): planned once per connection instead of
# parsed and planned on every submit.


# PostgreSQL's function that takes a tenant's count row lock, then counts its queue
# (apps/admission/migrations/0004_queue_room_function.py).
QUEUE_ROOM = "gpuplatform_queue_room"


@cache
def _cap_statements(vendor: str) -> dict:
    counts, counted = table(QueuedCount), column(QueuedCount, "queued")
    of_tenant = f"{column(QueuedCount, 'tenant')} = %s"
    arrays, size, made = (
        table(JobArray),
        column(JobArray, "size"),
        column(JobArray, "materialised"),
    )
    tenants, tenant_pk = table(Tenant), column(Tenant, "id")
    virtual = (
        f"SELECT COALESCE(SUM({size} - {made}), 0) FROM {arrays} WHERE {column(JobArray, 'tenant')} = %s "
        f"AND {column(JobArray, 'cancelled_at')} IS NULL AND {column(JobArray, 'failed_reason')} = '' AND {made} < {size}"
    )  # (an array failed by a dependency: its virtual tasks are failed, docs/pipelines.md)
    jobs, events, new_arrays = Inserter(Job), Inserter(JobEvent), Inserter(JobArray)

    def admit(*inserters: Inserter) -> str:
        """Each row inserted only if the one before was: the first only if the tenant has room
        for `wanted` more (`gpuplatform_queue_room(tenant, wanted, cap)`: the counts read under
        the count row's lock). One row back: the counts and whether the rows went in; none where
        the tenant has no count row (nothing was inserted)."""
        names = ["room", *(f"new_{n}" for n in range(len(inserters)))]
        inserts = ", ".join(
            f"{name} AS ({inserter.gated(before)} RETURNING 1)"
            for before, name, inserter in zip(names, names[1:], inserters, strict=False)
        )
        return (
            f"WITH c AS (SELECT * FROM {QUEUE_ROOM}(%s, %s, %s)), "
            f"room AS (SELECT 1 FROM c WHERE c.has_room), {inserts} "
            f"SELECT c.queued_jobs, c.virtual_tasks, (SELECT COUNT(*) FROM {names[-1]}) FROM c"
        )

    return {
        "lock_count": f"SELECT {counted} FROM {counts} WHERE {of_tenant} FOR UPDATE",
        # NO KEY UPDATE: as lock_tenant's (`_statements`).
        "lock_tenant_and_count": (
            f"WITH t AS (SELECT {tenant_pk} FROM {tenants} WHERE {tenant_pk} = %s FOR NO KEY UPDATE), "
            f"c AS (SELECT {counted} FROM {counts} WHERE {of_tenant} FOR UPDATE) "
            f"SELECT (SELECT COUNT(*) FROM t), (SELECT COUNT(*) FROM c)"
        ),
        "queued": f"SELECT (SELECT {counted} FROM {counts} WHERE {of_tenant}), ({virtual})",
        # SQLite, in the transaction that holds its one write lock: the job's row inserted only if
        # the tenant's queue has room, the check and the insert in one statement.
        "job_if_room": jobs.gated(
            f"(SELECT 1 WHERE COALESCE((SELECT {counted} FROM {counts} WHERE {of_tenant}), 0) "
            f"+ ({virtual}) < %s) room"
        ),
        # PostgreSQL, outside a transaction: a submit's lock, check and inserts in one statement,
        # committed on its own (the statement's implicit transaction).
        # Numbered (apps/platform/db.py): 62 parameters, more than psycopg keeps the placeholders'
        # rewrite of.
        "admit_job": NumberedStatement(admit(jobs, events)),
        "admit_array": NumberedStatement(admit(new_arrays)),
        "array": new_arrays,
    }  # fmt: skip


def _after_lock(lock: str, sql: str, params: list):
    """PostgreSQL: the statement `lock`, then `sql`, sent as one query string (psycopg's
    client-side cursor, Django's default, sends it as one simple query; outside a transaction
    the two are one, committed at the end). `params`: both statements', in order. The first row
    of `sql`, or None."""
    with _cursor() as cursor:
        cursor.execute(f"{lock}; {sql}", params)
        cursor.nextset()
        return cursor.fetchone()


def queued_for_cap(tenant: Tenant, *, lock_tenant: bool = False) -> int:
    """In the caller's transaction: the tenant's queued jobs and its arrays' virtual tasks, for
    the queued-job cap. PostgreSQL: counted after taking the count row's lock (and the tenant's,
    `lock_tenant`), both held to the commit; one round trip. SQLite: the caller's transaction
    holds the one write lock already."""
    s, pk = _cap_statements(_db().vendor), tenant.pk
    if _db().vendor != "postgresql":
        row = _one(s["queued"], [pk, pk])
    elif lock_tenant:
        row = _after_lock(s["lock_tenant_and_count"], s["queued"], [pk, pk, pk, pk])
    else:
        row = _after_lock(s["lock_count"], s["queued"], [pk, pk, pk])
    assert row is not None  # a SELECT of two values: one row
    return int(row[0] or 0) + int(row[1] or 0)


def insert_if_room(
    job: Job, event: JobEvent, params: tuple[list, list] | None = None, *, cap: int
) -> Job | None:
    """SQLite, in the caller's transaction (which holds the one write lock): the job's row if
    the tenant's queue (kept count and arrays' virtual tasks, as `queued_for_cap` counts it) is
    under `cap`, checked in the insert itself, then its event. The job as saved, or None:
    the queue is full, nothing inserted. One statement fewer than the count and the insert.
    `params`: insert_params' for them, as `insert_job_and_event`'s."""
    job_params, event_params = params or insert_params(job, event)
    pk = job.tenant_id
    with _cursor() as cursor:
        cursor.execute(_cap_statements(_db().vendor)["job_if_room"], [*job_params, pk, pk, cap])
        if cursor.rowcount != 1:
            return None
        cursor.execute(statements()["event"].sql, event_params)
    return _saved(job)


def admit(job: Job, event: JobEvent, *, cap: int) -> tuple[int, Job | None] | None:
    """PostgreSQL, outside a transaction: the job and its event, inserted if the tenant's queue
    (its queued jobs and its arrays' virtual tasks) is under `cap`, in one round trip committed
    on its own. Returns the queue before this job and the job as saved, or None in its place
    (the cap is reached: nothing inserted); None where the tenant has no count row yet (its
    first job: nothing inserted either)."""
    s = statements()
    found = _admit(
        "admit_job", job.tenant_id, 1, cap, [*s["job"].params(job), *s["event"].params(event)]
    )
    if found is None:
        return None
    queued, inserted = found
    return queued, _saved(job) if inserted else None  # the event is not needed again: not rebuilt


def admit_array(array: JobArray, *, cap: int) -> tuple[int, JobArray | None] | None:
    """As `admit`, for a new job array's row alone (its tasks all virtual): the tenant's queue
    must have room for the whole array. The queue before it and the array as saved, or None in
    its place; None where the tenant has no count row yet."""
    values = _cap_statements(_db().vendor)["array"].params(array)
    found = _admit("admit_array", array.tenant_id, array.size, cap, values)
    if found is None:
        return None
    queued, inserted = found
    return queued, _saved(array) if inserted else None


def _admit(name: str, tenant_id, wanted: int, cap: int, values: list) -> tuple[int, bool] | None:
    """Statement `name` with the rows' `values`: (the tenant's queue before, whether the rows
    went in), or None where the tenant has no count row. Prepared on the server as on
    `_prepared_cursor`: it has the same text on every submit, and planning it was a quarter of
    the server's CPU for the statement (docs/bench/71-slurm-peer-notes.md, h36pg pass); sent in
    its numbered form (`NumberedStatement`), which psycopg need not rewrite on every submit."""
    db = _db()
    row = _cap_statements(db.vendor)[name].fetchone([tenant_id, wanted, cap, *values], db)
    if row is None:
        return None
    queued, virtual, inserted = row
    return queued + virtual, bool(inserted)


# --- job arrays (apps/admission/arrays.py) -------------------------------------------------------


def insert_array_job_and_event(array: JobArray, job: Job, event: JobEvent) -> tuple[JobArray, Job]:
    """A new job array, its first task and that task's event: on PostgreSQL in one statement (a
    data-modifying WITH). Returns the array and the job as saved (`_saved`)."""
    s, a = statements(), _cap_statements(_db().vendor)
    array_params = a["array"].params(array)
    job_params, event_params = s["job"].params(job), s["event"].params(event)
    with _cursor() as cursor:
        if _db().vendor == "postgresql":
            cursor.execute(
                f"WITH new_array AS ({a['array'].sql}), new_job AS ({s['job'].sql}) {s['event'].sql}",
                array_params + job_params + event_params,
            )
        else:
            cursor.execute(a["array"].sql, array_params)
            cursor.execute(s["job"].sql, job_params)
            cursor.execute(s["event"].sql, event_params)
    return _saved_array(array, job)


def _saved_array(array: JobArray, job: Job) -> tuple[JobArray, Job]:
    saved = _saved(array)
    job = _saved(job)
    job.array = saved
    return saved, job
