"""Pages by id prefix: /jobs/1a2b3c4d/ as the client prints ids, redirected to the page of the one
job (or array) the prefix names among those the user may see (apps/jobs/lookup.py). A prefix
that names none is a 404; one that names several is a 400 that says so."""

from __future__ import annotations

from django.contrib.auth.decorators import login_required
from django.http import Http404, HttpResponseBadRequest
from django.shortcuts import redirect
from django.urls import reverse
from rest_framework.exceptions import NotFound, ValidationError

from apps.jobs.access import visible_arrays, visible_jobs
from apps.jobs.lookup import resolve


def _page(rows, prefix: str, *, what: str, route: str, kwarg: str):
    try:
        pk = resolve(rows, prefix, what=what)
    except NotFound:
        raise Http404(f"no such {what}") from None
    except ValidationError as error:
        return HttpResponseBadRequest(" ".join(_flat(error.detail)), content_type="text/plain")
    return redirect(reverse(route, kwargs={kwarg: pk}))


def _flat(detail) -> list[str]:
    if isinstance(detail, dict):
        return [text for value in detail.values() for text in _flat(value)]
    if isinstance(detail, list):
        return [text for value in detail for text in _flat(value)]
    return [str(detail)]


@login_required
def job_by_prefix(request, prefix: str):
    return _page(
        visible_jobs(request.user), prefix, what="job", route="web-job-detail", kwarg="job_id"
    )


@login_required
def array_by_prefix(request, prefix: str):
    return _page(visible_arrays(request.user), prefix, what="job array", route="web-array-detail",
                 kwarg="array_id")  # fmt: skip
