"""Secrets in the admin: tenant, name and dates only. The value is never shown, nor its
ciphertext; the change form has a write-only "new value" field that replaces it."""

from django import forms
from django.contrib import admin
from django.views.decorators.debug import sensitive_variables

from apps.secrets import crypto
from apps.secrets.models import Secret
from apps.secrets.services import value_problem
from apps.tenants.audit import AuditedAdmin


class SecretForm(forms.ModelForm):
    new_value = forms.CharField(
        required=False,
        strip=False,
        widget=forms.PasswordInput(render_value=False),  # never rendered back into the page
        help_text="Write only: replaces the value (empty keeps it). The value is never shown.",
    )

    class Meta:
        model = Secret
        fields = ["tenant", "name"]

    @sensitive_variables()
    def clean_new_value(self) -> str:
        value = self.cleaned_data.get("new_value", "")
        if self.instance.pk is None and not value:
            raise forms.ValidationError("a new secret needs a value")
        problem = value_problem(value) if value else None
        if problem:
            raise forms.ValidationError(problem)
        return value

    @sensitive_variables()
    def save(self, commit=True):
        secret = super().save(commit=False)
        value = self.cleaned_data.get("new_value")
        if value:
            secret.ciphertext = crypto.encrypt(
                tenant_id=secret.tenant_id, name=secret.name, value=value
            )
        if commit:
            secret.save()
        return secret


@admin.register(Secret)
class SecretAdmin(AuditedAdmin):
    form = SecretForm
    list_display = ["name", "tenant", "created_at", "updated_at", "updated_by"]
    list_filter = ["tenant"]
    list_select_related = ["tenant", "updated_by"]
    search_fields = ["name", "tenant__slug"]
    readonly_fields = ["created_at", "updated_at", "created_by", "updated_by"]

    def get_readonly_fields(self, request, obj=None):
        # A secret is bound to its tenant and name (crypto.py): replace the value, not those.
        fields = list(super().get_readonly_fields(request, obj))
        return [*fields, "tenant", "name"] if obj is not None else fields

    def save_model(self, request, obj, form, change):
        if not change:
            obj.created_by = request.user
        if form.cleaned_data.get("new_value") or not change:
            obj.updated_by = request.user
        super().save_model(request, obj, form, change)

    def construct_change_message(self, request, form, formsets, add=False):
        # AuditedAdmin lists each changed field's old and new values: never this one's.
        changed = form.changed_data
        form.changed_data[:] = [name for name in changed if name != "new_value"]
        message = super().construct_change_message(request, form, formsets, add)
        if form.cleaned_data.get("new_value"):
            message = f"Replaced the value (not logged). {message}"
        return message
