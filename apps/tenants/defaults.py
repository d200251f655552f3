"""The records every installation starts with: the default tiers and the built-in templates.
Used by the data migrations (with historical models) and by `bootstrap_demo`."""

from django.apps import apps as django_apps

TIERS = [
    # name, rank, level, weight, preemptible, can_preempt, max_queued, rate/min, burst, grace s
    ("enterprise", 3, 1, 1, False, True, 1000, 600, 100, 60),
    ("pro", 2, 0, 3, False, False, 200, 120, 30, 30),
    ("free", 1, 0, 1, True, False, 20, 20, 5, 15),
]

# Policy settings per tier: guaranteed share, borrowing limit, age limit (s), min runtime (s),
# max preemptions. Enterprise never waits behind lower tiers; free is preemptible.
TIER_POLICY = {
    "enterprise": dict(guaranteed_share=0.0, borrowing_limit=None, age_limit_seconds=3600,
                       min_runtime_seconds=0, max_preemptions=3),
    "pro": dict(guaranteed_share=0.3, borrowing_limit=None, age_limit_seconds=12 * 3600,
                min_runtime_seconds=15 * 60, max_preemptions=3),
    "free": dict(guaranteed_share=0.1, borrowing_limit=None, age_limit_seconds=24 * 3600,
                 min_runtime_seconds=15 * 60, max_preemptions=3),
}  # fmt: skip

# Idle GPUs per tier (docs/telemetry.md), as Princeton's Job Defense Shield: free warns at 60
# minutes and cancels at 120, pro warns at 120 and takes no action, enterprise neither.
TIER_IDLE_POLICY: dict[str, dict[str, object]] = {
    "enterprise": dict(gpu_idle_warn_minutes=None, gpu_idle_minutes=None, gpu_idle_action="none"),
    "pro": dict(gpu_idle_warn_minutes=120, gpu_idle_minutes=None, gpu_idle_action="none"),
    "free": dict(gpu_idle_warn_minutes=60, gpu_idle_minutes=120, gpu_idle_action="cancel"),
}

TEMPLATES = [
    {
        "name": "demo-train",
        "description": "A checkpointing training loop: progress every step, resumes, writes result.json.",
        "argv": ["{python}", "-m", "gpuplatform_job.demo_train"],
        "params_schema": {
            "steps": {"type": "integer", "minimum": 1, "maximum": 100000, "default": 10},
            "step_seconds": {"type": "number", "minimum": 0, "maximum": 60, "default": 0.1},
            "fail_at_step": {"type": "integer", "minimum": 0, "maximum": 100000},
        },
        "checkpointable": True,
        "cacheable": False,
        "default_max_runtime_seconds": 3600,
    },
    {
        "name": "demo-infer",
        "description": "Deterministic text generation: same prompt and settings, same output.",
        "argv": ["{python}", "-m", "gpuplatform_job.demo_infer"],
        "params_schema": {
            "prompt": {"type": "string", "max_length": 10000, "required": True},
            "max_tokens": {"type": "integer", "minimum": 1, "maximum": 4096, "default": 32},
            "temperature": {"type": "number", "minimum": 0, "maximum": 2, "default": 0},
            "seed": {"type": "integer", "minimum": 0, "maximum": 2**31 - 1},
        },
        "checkpointable": False,
        "cacheable": True,
        "default_max_runtime_seconds": 600,
    },
]


def ensure_tiers(Tier, *, with_policy: bool = True) -> None:
    """Create the default tiers that are missing. The first data migration runs before the
    policy fields exist, so it passes with_policy=False (migration 0004 fills them in)."""
    for name, rank, level, weight, preemptible, can_preempt, queued, rate, burst, grace in TIERS:
        Tier.objects.get_or_create(
            name=name,
            defaults=dict(
                rank=rank, level=level, weight=weight, preemptible=preemptible, can_preempt=can_preempt,
                max_queued_jobs=queued, submit_rate_per_minute=rate, submit_burst=burst,
                preemption_grace_seconds=grace, **(TIER_POLICY[name] if with_policy else {}),
                **(TIER_IDLE_POLICY[name] if with_policy else {}),
            ),
        )  # fmt: skip


def apply_tier_policy(Tier) -> None:
    """Give existing default tiers their policy settings (used by the migration adding them)."""
    for name, values in TIER_POLICY.items():
        Tier.objects.filter(name=name).update(**values)


def apply_tier_idle_policy(Tier) -> None:
    """Give existing default tiers their idle-GPU settings (the migration adding them)."""
    for name, values in TIER_IDLE_POLICY.items():
        Tier.objects.filter(name=name).update(**values)


def ensure_templates(JobTemplate) -> None:
    for spec in TEMPLATES:
        JobTemplate.objects.get_or_create(
            name=spec["name"], defaults={k: v for k, v in spec.items() if k != "name"}
        )


def ensure_defaults() -> None:
    # The models through the app registry, as the migrations get them: the templates are jobs'
    # rows, and tenants sit below jobs (they import nothing of them).
    ensure_tiers(django_apps.get_model("tenants", "Tier"))
    ensure_templates(django_apps.get_model("jobs", "JobTemplate"))
