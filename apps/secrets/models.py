"""Tenant secrets (docs/secrets.md): a name and the value's ciphertext, never the value itself.

The value is encrypted by apps/secrets/crypto.py before it reaches a row, and decrypted only to
answer the agent API's secrets endpoint for an attempt placed on the asking node."""

from django.conf import settings
from django.core.validators import RegexValidator
from django.db import models

from apps.tenants.models import Tenant

NAME_PATTERN = r"^[A-Z_][A-Z0-9_]*$"
NAME_MAX = 128
name_validator = RegexValidator(
    NAME_PATTERN, "an environment variable name: A-Z, 0-9 and _, not starting with a digit"
)


class Secret(models.Model):
    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="secrets")
    name = models.CharField(max_length=NAME_MAX, validators=[name_validator])
    # A Fernet token (crypto.py) of the value bound to its tenant and name; never shown anywhere.
    ciphertext = models.TextField(editable=False)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    updated_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )

    class Meta:
        ordering = ["tenant", "name"]
        constraints = [
            models.UniqueConstraint(fields=["tenant", "name"], name="secret_unique_name_per_tenant")
        ]

    def __str__(self) -> str:
        return f"{self.tenant.slug}/{self.name}"
