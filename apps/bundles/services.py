"""Storing, finding, touching and expiring code bundles (docs/own-code.md, "Bundles").

An upload is read in chunks from whatever file-like object holds the body (the request's
stream, an uploaded form file): each chunk is hashed, counted against the tenant's cap and
written to a temporary file, which is then saved through Django's storage API under a name with
the digest. Nothing holds the whole archive in memory.
"""

from __future__ import annotations

import hashlib
import logging
import re
import tempfile
import zlib
from dataclasses import dataclass
from datetime import timedelta
from typing import Protocol

from django.conf import settings
from django.core.files import File
from django.core.files.storage import default_storage
from django.db import IntegrityError, transaction
from django.db.models import Exists, OuterRef
from django.utils import timezone

from apps.bundles.models import SUFFIXES, Bundle, BundleKind
from apps.jobs.models import JOB_ACTIVE, Job
from apps.tenants.models import Tenant

log = logging.getLogger(__name__)

CHUNK = 1 << 20
HEAD_BYTES = 64 * 1024  # the archive's start, checked against its Content-Type
SHA256 = re.compile(r"^[0-9a-f]{64}$")
MIB = 1024 * 1024
# Content-Type -> kind; the two documented ones and the aliases browsers and old tools send.
KINDS = {
    "application/gzip": BundleKind.GZIP,
    "application/x-gzip": BundleKind.GZIP,
    "application/x-tar+gzip": BundleKind.GZIP,
    "application/zip": BundleKind.ZIP,
    "application/x-zip-compressed": BundleKind.ZIP,
}
GZIP_MAGIC = b"\x1f\x8b"
ZIP_MAGICS = (b"PK\x03\x04", b"PK\x05\x06")  # a local file header; an empty archive's end record


class Readable(Protocol):
    def read(self, size: int = ..., /) -> bytes: ...


class BundleRefused(Exception):
    """An upload refused: `status` (400 or 413), `field` and a message naming what was wrong."""

    def __init__(self, message: str, *, field: str = "body", status: int = 400):
        super().__init__(message)
        self.message, self.field, self.status = message, field, status


@dataclass(frozen=True)
class Stored:
    bundle: Bundle
    created: bool  # False: the tenant had it already (nothing new was stored)


def _mib(size: int) -> str:
    return f"{size / MIB:.1f} MiB"


def too_large(size: int, cap: int, *, so_far: bool = False) -> BundleRefused:
    what = f"more than {size} bytes" if so_far else f"{size} bytes ({_mib(size)})"
    return BundleRefused(
        f"the bundle is {what}, over this tenant's bundle cap of {cap // MIB} MiB ({cap} bytes)",
        status=413,
    )


def kind_of(content_type: str) -> BundleKind:
    media = content_type.split(";")[0].strip().lower()
    kind = KINDS.get(media)
    if kind is None:
        raise BundleRefused(
            f"must be application/gzip (a .tar.gz) or application/zip, not {media or 'none'!r}",
            field="Content-Type",
        )
    return kind


def check_magic(kind: BundleKind, head: bytes) -> None:
    """The first bytes must be what the Content-Type says: gzip's magic and a tar header inside
    (or a tar's end-of-archive zeros), or a zip's local file header (or an empty zip)."""
    if kind == BundleKind.ZIP:
        if not head.startswith(ZIP_MAGICS):
            raise BundleRefused("not a zip archive (it does not start with PK\\x03\\x04)")
        return
    if not head.startswith(GZIP_MAGIC):
        raise BundleRefused("not gzip data (it does not start with \\x1f\\x8b)")
    try:
        block = zlib.decompressobj(16 + zlib.MAX_WBITS).decompress(head, 512)
    except zlib.error as error:
        raise BundleRefused(f"not valid gzip data: {error}") from None
    if len(block) < 512 and len(head) >= HEAD_BYTES:
        return  # a very compressible start: the node's unpacking checks the rest
    if len(block) < 512 or not (block[257:262] == b"ustar" or block == bytes(512)):
        raise BundleRefused("gzip data that is not a tar archive (no tar header inside)")


def store(*, tenant: Tenant, user, source: Readable, content_type: str,
          length: int | None = None) -> Stored:  # fmt: skip
    """Store the archive read from `source` as a bundle of `tenant` (deduplicated by digest).

    `length`: the body's declared size (Content-Length), checked against the cap before any
    byte is read; what arrives is counted too, so a body without one (or a wrong one) stops at
    the cap. Raises BundleRefused."""
    kind = kind_of(content_type)
    cap = tenant.bundle_cap_bytes
    if length is not None and length > cap:
        raise too_large(length, cap)
    digest, size, head = hashlib.sha256(), 0, b""
    spool_dir = settings.FILE_UPLOAD_TEMP_DIR  # Django's setting for uploads (None: the system's)
    with tempfile.NamedTemporaryFile(
        prefix="bundle-", suffix=SUFFIXES[kind], dir=spool_dir
    ) as spool:
        while chunk := source.read(CHUNK):
            if len(head) < HEAD_BYTES:
                head += chunk[: HEAD_BYTES - len(head)]
                if len(head) >= HEAD_BYTES:
                    check_magic(kind, head)
            size += len(chunk)
            if size > cap:
                raise too_large(cap, cap, so_far=True)
            digest.update(chunk)
            spool.write(chunk)
        if size == 0:
            raise BundleRefused("the request body is empty: send the archive's bytes")
        if len(head) < HEAD_BYTES:
            check_magic(kind, head)
        spool.flush()
        sha256 = digest.hexdigest()
        existing = touch(tenant, sha256)
        if existing is not None and default_storage.exists(existing.storage_name):
            return Stored(bundle=existing, created=False)
        spool.seek(0)
        name = default_storage.save(
            f"bundles/{tenant.pk}/{sha256}{SUFFIXES[kind]}", File(spool, name=spool.name)
        )
    if existing is not None:  # its row outlived its file (storage restored, wiped): the file again
        Bundle.objects.filter(pk=existing.pk).update(storage_name=name)
        existing.storage_name = name
        log.warning(
            "bundle %s of tenant %s had lost its file; stored it again", sha256, tenant.slug
        )
        return Stored(bundle=existing, created=False)
    try:
        with transaction.atomic():
            bundle = Bundle.objects.create(tenant=tenant, sha256=sha256, size=size, storage_name=name,
                                           content_type=kind, uploaded_by=user)  # fmt: skip
    except IntegrityError:  # the same archive uploaded at the same time: the other one won
        default_storage.delete(name)
        return Stored(bundle=Bundle.objects.get(tenant=tenant, sha256=sha256), created=False)
    log.info("bundle %s stored for tenant %s (%d bytes)", sha256, tenant.slug, size)
    return Stored(bundle=bundle, created=True)


def touch(tenant: Tenant | int, sha256: str) -> Bundle | None:
    """The tenant's bundle of that digest with its `last_used_at` set to now, or None (another
    tenant's bundle is None too: tenants never see each other's bundles)."""
    tenant_id = tenant if isinstance(tenant, int) else tenant.pk
    if not SHA256.fullmatch(sha256):
        return None
    now = timezone.now()
    if not Bundle.objects.filter(tenant_id=tenant_id, sha256=sha256).update(last_used_at=now):
        return None
    return Bundle.objects.filter(tenant_id=tenant_id, sha256=sha256).first()


def use(tenant_id: int, sha256: str) -> bool:
    """A submit names this bundle: True if it is the tenant's (its last use is now), else False.
    One statement: the touch is the existence check, and a bundle touched here is no longer
    old enough for `expire` to take (it re-checks `last_used_at` as it deletes)."""
    return bool(
        Bundle.objects.filter(tenant_id=tenant_id, sha256=sha256).update(
            last_used_at=timezone.now()
        )
    )


def in_use(bundle: Bundle) -> bool:
    """A job of its tenant in a live state (queued or placed) names it."""
    return Job.objects.filter(
        tenant_id=bundle.tenant_id, bundle=bundle.sha256, state__in=JOB_ACTIVE
    ).exists()


class BundleInUse(Exception):
    pass


def delete(bundle: Bundle) -> None:
    """Delete a bundle no live job uses (BundleInUse otherwise): the row, then the file."""
    with transaction.atomic():
        if in_use(bundle):
            raise BundleInUse
        Bundle.objects.filter(pk=bundle.pk).delete()
    _delete_file(bundle.storage_name)


def expire(*, now=None, days: int | None = None) -> list[str]:
    """Delete (row and file) every bundle that no job in a live state uses and that was last
    used more than `days` (GPUPLATFORM_BUNDLE_RETENTION_DAYS) ago. Answers the storage names
    deleted. Each delete re-checks both conditions, so a bundle a submit touches or a job names
    meanwhile stays."""
    now = now or timezone.now()
    days = settings.BUNDLE_RETENTION_DAYS if days is None else days
    cutoff = now - timedelta(days=days)
    live = Job.objects.filter(
        tenant_id=OuterRef("tenant_id"), bundle=OuterRef("sha256"), state__in=JOB_ACTIVE
    )
    deleted = []
    for pk, name in (
        Bundle.objects.filter(last_used_at__lt=cutoff)
        .exclude(Exists(live))
        .values_list("pk", "storage_name")
    ):
        with transaction.atomic():
            gone, _ = (
                Bundle.objects.filter(pk=pk, last_used_at__lt=cutoff).exclude(Exists(live)).delete()
            )
        if gone:
            _delete_file(name)
            deleted.append(name)
    if deleted:
        log.info("expired %d unused bundles (retention %d days)", len(deleted), days)
    return deleted


def _delete_file(name: str) -> None:
    try:
        default_storage.delete(name)
    except OSError:  # gone already, or the storage is down: the row is what counts
        log.warning("could not delete the stored bundle %s", name, exc_info=True)
