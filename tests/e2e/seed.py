"""`python -m tests.e2e.seed`: the end-to-end cast in the platform's database; prints tokens as JSON."""

import json
import os

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "gpuplatform.settings")

import django  # noqa: E402

django.setup()

from apps.tenants.defaults import ensure_defaults  # noqa: E402
from apps.tenants.services import tenant_create, user_create  # noqa: E402

ensure_defaults()
tenant_create(slug="acme", tier_name="enterprise", allow_commands=True)
tenant_create(slug="globex", tier_name="pro")
tenant_create(slug="hobby", tier_name="free")
# Free jobs may be preempted at once and get a short grace, so the preemption test is quick.
from apps.tenants.models import Tier  # noqa: E402

Tier.objects.filter(name="free").update(min_runtime_seconds=0, preemption_grace_seconds=5)
tokens = {}
for username, slug, role in [
    ("alice", "acme", "admin"),
    ("bob", "acme", "member"),
    ("carol", "acme", "viewer"),
    ("dave", "globex", "member"),
    ("erin", "hobby", "member"),
]:
    tokens[username] = user_create(
        username=username, tenant_slug=slug, role=role, password="e2e-password"
    )[1]
tokens["staff"] = user_create(
    username="staff", tenant_slug=None, staff=True, password="e2e-password"
)[1]
print(json.dumps(tokens))
