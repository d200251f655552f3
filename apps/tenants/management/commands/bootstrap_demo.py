from django.core.management.base import BaseCommand

from apps.nodes.models import GpuSku
from apps.scheduling.models import AutoscalePolicy
from apps.tenants.defaults import ensure_defaults
from apps.tenants.services import tenant_create, user_create

DEMO = [
    # tenant, tier, allow commands, [(username, role)]
    ("acme", "enterprise", True, [("alice", "admin"), ("bob", "member"), ("carol", "viewer")]),
    ("globex", "pro", False, [("dave", "member")]),
    ("hobby", "free", False, [("erin", "member")]),
]
DEMO_PASSWORD = "demo-password"  # noqa: S105 (demo accounts, printed on purpose)


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
        "Idempotent: default tiers and templates, demo tenants and users; prints a new API token for "
        "each (replacing the one the last run printed: tokens are stored hashed, so old keys cannot be shown again)."
    )

    def handle(self, **options):
        ensure_defaults()
        self.stdout.write(f"{'user':8} {'tenant':8} {'tier':11} {'role':7} token")
        for slug, tier, commands, users in DEMO:
            tenant_create(slug=slug, tier_name=tier, allow_commands=commands)
            for username, role in users:
                _, key = user_create(
                    username=username,
                    tenant_slug=slug,
                    role=role,
                    password=DEMO_PASSWORD,
                    token="demo",
                )
                self.stdout.write(f"{username:8} {slug:8} {tier:11} {role:7} {key}")
        ensure_demo_autoscaling()
        _, key = user_create(
            username="staff", tenant_slug=None, staff=True, password=DEMO_PASSWORD, token="demo"
        )
        self.stdout.write(f"{'staff':8} {'-':8} {'-':11} {'staff':7} {key}")
        self.stdout.write(f"web and admin password for every demo user: {DEMO_PASSWORD}")
