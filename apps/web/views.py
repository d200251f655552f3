"""Customer pages (session login). Thin: they read through the same selectors as the API."""

from django.contrib.auth.decorators import login_required
from django.shortcuts import get_object_or_404, render

from apps.jobs.access import membership_of, visible_jobs
from apps.jobs.models import JobTemplate


@login_required
def dashboard(request):
    jobs = visible_jobs(request.user).select_related("tier", "gpu_sku")[:20]
    return render(request, "web/dashboard.html", {"jobs": jobs, "membership": membership_of(request.user)})


@login_required
def job_list(request):
    jobs = visible_jobs(request.user).select_related("tier", "gpu_sku")[:200]
    return render(request, "web/job_list.html", {"jobs": jobs})


@login_required
def job_detail(request, job_id):
    job = get_object_or_404(visible_jobs(request.user).select_related("tier", "gpu_sku"), pk=job_id)
    return render(request, "web/job_detail.html", {"job": job, "attempts": job.attempts.prefetch_related("members__node")})


@login_required
def job_new(request):
    return render(request, "web/job_new.html", {"templates": JobTemplate.objects.all()})


@login_required
def usage(request):
    return render(request, "web/usage.html", {"membership": membership_of(request.user)})
