"""`bootstrap_demo`: the demo's tiers, templates, tenants and users, and their API tokens.

The demo tokens' keys are kept in `<data dir>/demo_tokens.json` (only this user can read it,
as the secret key beside it) and printed again by later runs while they still work, so a
`GPUPLATFORM_TOKEN` exported from one `make run` keeps working in the next; `--rotate-tokens`
replaces them.
"""

import json
import os
import pathlib

from django.conf import settings
from django.core.management.base import BaseCommand

from apps.nodes.models import GpuSku
from apps.scheduling.models import AutoscalePolicy
from apps.tenants.defaults import ensure_defaults
from apps.tenants.models import ApiToken
from apps.tenants.services import tenant_create, user_create
from apps.tenants.tokens import digest_of, refusal, token_issue

DEMO = [
    # tenant, tier, allow commands, [(username, role)]
    ("acme", "enterprise", True, [("alice", "admin"), ("bob", "member"), ("carol", "viewer")]),
    ("globex", "pro", False, [("dave", "member")]),
    ("hobby", "free", False, [("erin", "member")]),
]
DEMO_PASSWORD = "demo-password"  # noqa: S105 (demo accounts, printed on purpose)
TOKEN_NAME = "demo"


def tokens_file() -> pathlib.Path:
    return pathlib.Path(settings.DATA_DIR) / "demo_tokens.json"


def kept_keys() -> dict:
    try:
        kept = json.loads(tokens_file().read_text())
    except (OSError, ValueError):
        return {}
    return kept if isinstance(kept, dict) else {}


def keep_keys(keys: dict) -> None:
    path = tokens_file()
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as handle:
        os.fchmod(handle.fileno(), 0o600)
        json.dump(keys, handle, indent=1, sort_keys=True)


def demo_key(user, kept, *, rotate: bool) -> str:
    """The user's demo key as kept, while it is still their working demo token; else a new one
    (which revokes the old one of that name)."""
    if not rotate and isinstance(kept, str):
        token = ApiToken.objects.filter(user=user, name=TOKEN_NAME, digest=digest_of(kept)).first()
        if token is not None and refusal(token) is None:
            return kept
    return token_issue(user=user, name=TOKEN_NAME)[1]


def ensure_demo_autoscaling() -> None:
    """An L4 pool with no static nodes: submitting L4 jobs makes fake nodes appear after the lag
    (30 s) and go away two minutes after they fall idle. Reactive: predictive did not reach 0.8x
    reactive's p95 wait on a trace it was not tuned on (docs/scheduling.md, "Autoscaling")."""
    sku, _ = GpuSku.objects.get_or_create(name="L4-24GB", defaults={"memory_mib": 24576})
    AutoscalePolicy.objects.get_or_create(
        sku=sku,
        defaults=dict(mode="reactive", gpus_per_node=2, min_nodes=0, max_nodes=3, provision_lag_seconds=30,
                      cooldown_seconds=120, labels={"pool": "autoscaled"}),
    )  # fmt: skip


class Command(BaseCommand):
    help = (
        "Idempotent: default tiers and templates, demo tenants and users, and an API token for each, "
        "kept in <data dir>/demo_tokens.json and printed again on later runs (--rotate-tokens: new ones)."
    )

    def add_arguments(self, parser):
        parser.add_argument(
            "--rotate-tokens", action="store_true",
            help="issue new demo tokens, revoking the kept ones",
        )  # fmt: skip

    def handle(self, **options):
        ensure_defaults()
        kept, keys = kept_keys(), {}
        rotate = options["rotate_tokens"]
        self.stdout.write(f"{'user':8} {'tenant':8} {'tier':11} {'role':7} token")
        for slug, tier, commands, users in DEMO:
            tenant_create(slug=slug, tier_name=tier, allow_commands=commands)
            for username, role in users:
                user, _ = user_create(username=username, tenant_slug=slug, role=role,
                                      password=DEMO_PASSWORD, token=None)  # fmt: skip
                keys[username] = demo_key(user, kept.get(username), rotate=rotate)
                self.stdout.write(f"{username:8} {slug:8} {tier:11} {role:7} {keys[username]}")
        ensure_demo_autoscaling()
        user, _ = user_create(
            username="staff", tenant_slug=None, staff=True, password=DEMO_PASSWORD, token=None
        )
        keys["staff"] = demo_key(user, kept.get("staff"), rotate=rotate)
        self.stdout.write(f"{'staff':8} {'-':8} {'-':11} {'staff':7} {keys['staff']}")
        keep_keys(keys)
        self.stdout.write(f"web and admin password for every demo user: {DEMO_PASSWORD}")
