"""Code bundles: a tenant's uploaded working directories (docs/own-code.md, "Bundles").

A bundle is the tenant's, named by the SHA-256 of its bytes: the same archive uploaded twice by
one tenant is one row and one stored file; another tenant's upload of the same bytes is its own
row and file (nothing is shared across tenants, so nothing leaks across them either). The file
lives in Django's storage (`storage_name`), never in the database.
"""

from django.conf import settings
from django.db import models
from django.utils import timezone

from apps.tenants.models import Tenant


class BundleKind(models.TextChoices):
    GZIP = "gzip", "gzip-compressed tar (.tar.gz)"
    ZIP = "zip", "zip"


MEDIA_TYPES = {BundleKind.GZIP: "application/gzip", BundleKind.ZIP: "application/zip"}
SUFFIXES = {BundleKind.GZIP: ".tar.gz", BundleKind.ZIP: ".zip"}


class Bundle(models.Model):
    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="bundles")
    sha256 = models.CharField(max_length=64, help_text="SHA-256 of the archive's bytes, hex.")
    size = models.BigIntegerField(help_text="Bytes.")
    storage_name = models.CharField(max_length=255, help_text="The file's name in storage.")
    content_type = models.CharField(max_length=8, choices=BundleKind.choices)
    uploaded_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    created_at = models.DateTimeField(auto_now_add=True)
    last_used_at = models.DateTimeField(
        default=timezone.now,
        help_text="Its last upload, HEAD or submit: retention counts from here.",
    )

    class Meta:
        ordering = ["-created_at"]
        constraints = [
            models.UniqueConstraint(fields=["tenant", "sha256"], name="one_bundle_per_digest")
        ]
        indexes = [models.Index(fields=["last_used_at"], name="bundle_last_used")]

    def __str__(self) -> str:
        return f"{self.sha256[:12]} of {self.tenant_id}"

    @property
    def media_type(self) -> str:
        return MEDIA_TYPES[BundleKind(self.content_type)]
