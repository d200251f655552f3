"""The tenant's secrets (/secrets/): every member sees their names and dates; tenant admins
create, replace and delete them. A value is typed into a password field, sent once, and never
shown or put back into a page (not even on a form that comes back with an error)."""

from django import forms
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import Http404, HttpResponseForbidden
from django.shortcuts import redirect, render
from django.views.decorators.debug import sensitive_post_parameters, sensitive_variables
from django.views.decorators.http import require_POST

from apps.jobs.access import membership_of
from apps.secrets.models import NAME_MAX
from apps.secrets.services import (
    SecretError,
    secret_create,
    secret_delete,
    secret_replace,
    tenant_secrets,
)
from apps.tenants.models import Role


def _value_field() -> forms.CharField:
    return forms.CharField(required=False, strip=False, label="Value",
                           widget=forms.PasswordInput(render_value=False),
                           help_text="Write only: never shown again, here or anywhere.")  # fmt: skip


class SecretForm(forms.Form):
    name = forms.CharField(
        max_length=NAME_MAX, help_text="An environment variable name, e.g. HF_TOKEN."
    )
    value = _value_field()


class ReplaceForm(forms.Form):
    value = _value_field()


def _membership(request):
    membership = membership_of(request.user)
    if membership is None:
        raise Http404("you belong to no tenant")
    return membership


def _secret(membership, name: str):
    secret = tenant_secrets(membership.tenant).filter(name=name).first()
    if secret is None:
        raise Http404("no such secret")
    return secret


def _page(request, membership, form, status=200):
    context = {"secrets": tenant_secrets(membership.tenant).select_related("updated_by"), "form": form,
               "is_admin": membership.role == Role.ADMIN, "replace_form": ReplaceForm()}  # fmt: skip
    return render(request, "web/secrets.html", context, status=status)


@sensitive_post_parameters("value")
@login_required
@sensitive_variables("form")
def secret_list(request):
    membership = _membership(request)
    if request.method != "POST":
        return _page(request, membership, SecretForm())
    if membership.role != Role.ADMIN:
        return HttpResponseForbidden("only tenant admins may create secrets")
    form = SecretForm(request.POST)
    if form.is_valid():
        try:
            secret_create(tenant=membership.tenant, name=form.cleaned_data["name"],
                          value=form.cleaned_data["value"], user=request.user)  # fmt: skip
        except SecretError as error:
            form.add_error(error.field, error.message)
        else:
            messages.success(request, f"Secret {form.cleaned_data['name']} created.")
            return redirect("web-secret-list")
    return _page(request, membership, form, status=400)


@sensitive_post_parameters("value")
@login_required
@require_POST
@sensitive_variables("form")
def secret_replace_page(request, name: str):
    membership = _membership(request)
    secret = _secret(membership, name)
    if membership.role != Role.ADMIN:
        return HttpResponseForbidden("only tenant admins may replace secrets")
    form = ReplaceForm(request.POST)
    try:
        if not form.is_valid():
            raise SecretError("value", "a value is required")
        secret_replace(secret=secret, value=form.cleaned_data["value"], user=request.user)
    except SecretError as error:
        messages.error(request, f"Secret {name} not replaced: {error.field} {error.message}.")
        return _page(request, membership, SecretForm(), status=400)
    messages.success(request, f"Secret {name} replaced.")
    return redirect("web-secret-list")


@login_required
@require_POST
def secret_delete_page(request, name: str):
    membership = _membership(request)
    secret = _secret(membership, name)
    if membership.role != Role.ADMIN:
        return HttpResponseForbidden("only tenant admins may delete secrets")
    secret_delete(secret=secret, user=request.user)
    messages.success(request, f"Secret {name} deleted.")
    return redirect("web-secret-list")
