"""Who changed what in the admin, and why.

- Job actions (cancel, requeue, preempt, bump) are recorded where every change of a job is: its
  JobEvent audit trail, actor `staff:<username>`, with the reason typed beside the action.
- Every other change made in the admin (a template's argv, a tier, a tenant's allow_commands, a
  quota, a node's state) is an admin LogEntry (`/admin/admin/logentry/`, and each object's
  History): the user, the fields with their old and new values, and the reason, which the
  change form asks for.
"""

from __future__ import annotations

import json
from functools import cache

from django import forms
from django.contrib import admin
from django.contrib.admin.helpers import ActionForm
from django.contrib.admin.models import LogEntry

REASON_HELP = "Why: kept in the audit log with your name and the change."


class ReasonActionForm(ActionForm):
    reason = forms.CharField(required=False, max_length=200, label="Reason", help_text=REASON_HELP)


def action_reason(request, default: str) -> str:
    """The reason typed beside an admin action, after the action's own words."""
    given = (request.POST.get("reason") or "").strip()[:200]
    return f"{default}: {given}" if given else default


@cache
def _audited(base: type[forms.ModelForm]) -> type[forms.ModelForm]:
    field = forms.CharField(max_length=200, label="Reason for this change", help_text=REASON_HELP)
    return type(f"Audited{base.__name__}", (base,), {"audit_reason": field})


class AuditedAdmin(admin.ModelAdmin):
    """A ModelAdmin whose change form wants a reason and whose log entries say what changed."""

    action_form = ReasonActionForm

    def get_form(self, request, obj=None, change=False, **kwargs):
        kwargs["form"] = _audited(kwargs.get("form", self.form))
        return super().get_form(request, obj, change=change, **kwargs)

    def construct_change_message(self, request, form, formsets, add=False):
        summary = LogEntry(
            change_message=json.dumps(
                super().construct_change_message(request, form, formsets, add)
            )
        )
        values = [
            f"{name}: {form.initial.get(name)!r} -> {form.cleaned_data.get(name)!r}"
            for name in form.changed_data
            if name != "audit_reason"
        ]
        details = f" ({'; '.join(values)})" if values and not add else ""
        return f"{summary.get_change_message() or 'No fields changed.'}{details} Why: {form.cleaned_data['audit_reason']}"

    def audit(self, request, obj, message: str) -> None:
        """A LogEntry for a change an action made (the change form's are made by the admin)."""
        self.log_change(request, obj, message)


def record(user, obj, action_flag: int, message: str) -> None:
    """A LogEntry for a change made outside the admin (the API, a page): the user, the object and
    what was done, in the same log as the admin's changes. `message` never carries a secret's
    value (apps/secrets/services.py)."""
    LogEntry.objects.log_actions(
        user_id=user.pk, queryset=[obj], action_flag=action_flag, change_message=message
    )
