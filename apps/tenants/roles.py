"""Staff roles as permission groups: support staff are `is_staff` in "support", and may add a
tenant's webhook (the usage page tells tenants to ask them); changing what runs on every node
(templates' argv), the tiers, tenants (their `allow_commands`), memberships, SKUs, autoscaling,
and changing or deleting webhooks needs "platform admin". Superusers are for operators only
(`create_user --superuser`).

`ensure_groups` is written against an apps registry so that the data migration
(0007_staff_groups) and `user_create` (a database flushed by a test) make the same groups.
"""

from __future__ import annotations

SUPPORT = "support"
PLATFORM_ADMIN = "platform admin"

# Everything staff look at in the admin (read only unless granted below).
VIEWED = {
    "jobs": [
        "job",
        "jobattempt",
        "attemptmember",
        "gpuallocation",
        "jobevent",
        "jobtemplate",
        "artifact",
    ],
    "nodes": ["node", "gpu", "gpusku"],
    "tenants": ["tier", "tenant", "membership", "quota", "apitoken"],
    "scheduling": ["autoscalepolicy", "provisionrequest", "scaleevent"],
    "webhooks": ["webhook", "webhookdelivery"],
    "secrets": ["secret"],  # names and dates only: the admin never shows a value
}
# Support's changes: the job actions (cancel, requeue, preempt, bump), the node actions (cordon,
# drain, ready), a tenant's quota, and a new webhook for a tenant.
SUPPORT_CHANGES = [("jobs", "change_job"), ("nodes", "change_node"), ("tenants", "change_quota"),
                   ("webhooks", "add_webhook")]  # fmt: skip
# Platform admin's, on top of support's.
ADMIN_MODELS = {
    "jobs": ["jobtemplate"],
    "nodes": ["gpusku", "node"],
    "tenants": ["tier", "tenant", "membership", "quota"],
    "scheduling": ["autoscalepolicy"],
    "webhooks": ["webhook"],
    "secrets": ["secret"],  # replace a value (write only) or delete, for a tenant that asks
}


def _codes() -> dict[str, list[tuple[str, str]]]:
    viewed = [(app, f"view_{model}") for app, models in VIEWED.items() for model in models]
    support = viewed + SUPPORT_CHANGES
    admin = support + [
        (app, f"{verb}_{model}")
        for app, models in ADMIN_MODELS.items()
        for model in models
        for verb in ("add", "change", "delete")
    ]
    return {SUPPORT: support, PLATFORM_ADMIN: admin}


def ensure_groups(apps=None) -> None:
    """The two groups with exactly their permissions (idempotent; permissions not yet made, as
    for an app that is not installed, are skipped)."""
    if apps is None:
        from django.apps import apps
    Group, Permission = apps.get_model("auth", "Group"), apps.get_model("auth", "Permission")
    for name, codes in _codes().items():
        group, _ = Group.objects.get_or_create(name=name)
        wanted = [
            p.pk
            for p in Permission.objects.filter(
                codename__in={code for _, code in codes}
            ).select_related("content_type")
            if (p.content_type.app_label, p.codename) in set(codes)
        ]
        group.permissions.set(wanted)
