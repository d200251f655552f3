"""DRF's clear-text tokens become hashed ApiTokens (named "migrated", same key, so clients keep
working) that expire after settings.MIGRATED_TOKEN_DAYS; then the clear keys are deleted.
rest_framework.authtoken stays installed only because this migration reads its table."""

import hashlib
from datetime import timedelta

from django.conf import settings
from django.db import migrations
from django.utils import timezone


def hash_tokens(apps, schema_editor):
    Token, ApiToken = apps.get_model("authtoken", "Token"), apps.get_model("tenants", "ApiToken")
    expires = timezone.now() + timedelta(days=settings.MIGRATED_TOKEN_DAYS)
    ApiToken.objects.bulk_create(
        ApiToken(
            user_id=t.user_id,
            name="migrated",
            prefix=t.key[:8],
            digest=hashlib.sha256(t.key.encode()).hexdigest(),
            expires_at=expires,
        )
        for t in Token.objects.all()
    )
    Token.objects.all().delete()


class Migration(migrations.Migration):
    dependencies = [
        ("tenants", "0006_apitoken"),
        ("authtoken", "0003_tokenproxy"),
    ]

    operations = [migrations.RunPython(hash_tokens, migrations.RunPython.noop)]
