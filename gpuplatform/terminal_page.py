"""`/jobs/{id}/terminal/`: a shell on an interactive job in the browser (docs/interactive.md),
through the same relay and session API as `gpuplatform shell` (static/js/terminal.js).

A page of its own rather than a part of the job page: xterm.js sets its cell sizes and colours
with `<style>` elements it makes at run time, which a policy without 'unsafe-inline' styles
refuses. Only this page allows inline styles; scripts stay 'self' here as everywhere, and the
job page keeps its strict policy.
"""

from django.conf import settings
from django.contrib.auth.decorators import login_required
from django.shortcuts import get_object_or_404, render

from apps.jobs.access import visible_jobs
from gpuplatform.csp import HEADER, policy_header

POLICY = policy_header(
    {
        **settings.CONTENT_SECURITY_POLICY,
        "style-src": [*settings.CONTENT_SECURITY_POLICY["style-src"], "'unsafe-inline'"],
    }
)


@login_required
def terminal(request, job_id):
    job = get_object_or_404(visible_jobs(request.user), pk=job_id)
    response = render(request, "web/terminal.html", {"job": job})
    response[HEADER] = POLICY
    return response
