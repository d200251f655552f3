"""The signed-in user's API tokens (/tokens/): list them, make one (its key shown once, on the
answer to the POST that made it, and kept nowhere), revoke one. Another user's token is a 404."""

from django import forms
from django.conf import settings
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.shortcuts import get_object_or_404, redirect, render
from django.views.decorators.http import require_POST

from apps.tenants import tokens
from apps.tenants.models import ApiToken

DAYS = [(30, "30 days"), (90, "90 days"), (365, "a year"), (0, "never")]


class TokenForm(forms.Form):
    name = forms.CharField(
        max_length=64,
        help_text="What it is for, e.g. ci or laptop. Reusing a name replaces that token.",
    )
    days = forms.TypedChoiceField(choices=DAYS, coerce=int, label="Expires after")

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.fields["days"].initial = settings.TOKEN_EXPIRY_DAYS


@login_required
def token_list(request):
    form, key, status = TokenForm(request.POST or None), None, 200
    if request.method == "POST":
        if form.is_valid():
            token, key = tokens.token_issue(
                user=request.user, name=form.cleaned_data["name"], days=form.cleaned_data["days"]
            )
            form = TokenForm()
        else:
            status = 400
    context = {
        "form": form,
        "key": key,
        "tokens": tokens.active_tokens(request.user),
        "days": settings.TOKEN_EXPIRY_DAYS,
    }
    response = render(request, "web/tokens.html", context, status=status)
    if key:
        response["Cache-Control"] = "no-store"  # the key is in this page only
    return response


@login_required
@require_POST
def token_revoke(request, token_id: int):
    token = get_object_or_404(ApiToken, pk=token_id, user=request.user, revoked_at__isnull=True)
    tokens.token_revoke(user=request.user, token_id=token.pk)
    messages.success(request, f"Token {token.name} revoked.")
    return redirect("web-token-list")
