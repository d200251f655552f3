"""Customer pages (session login). Thin: they read through the same selectors as the API and
change jobs only through the same services (`job_submit`, `job_cancel`).

Every page is plain HTML that works without JavaScript; with htmx loaded, the live parts
(job table, job status, log tail) poll their own URL and get just the fragment back.
"""

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.paginator import Paginator
from django.db.models import Q
from django.http import HttpResponseForbidden
from django.shortcuts import get_object_or_404, redirect, render
from django.utils import timezone
from django.views.decorators.http import require_POST

from apps.admission.usage import admission_usage
from apps.jobs import arrays as array_tasks
from apps.jobs import services
from apps.jobs.access import can_cancel, membership_of, visible_arrays, visible_jobs
from apps.jobs.api import job_queryset
from apps.jobs.models import JOB_ACTIVE, JOB_TERMINAL, JobState, JobTemplate
from apps.jobs.serializers import JobSerializer
from apps.tenants.models import Tier
from apps.web import array_rows, resubmit, selectors, submit
from apps.webhooks.models import Webhook, WebhookDelivery

JOBS_PER_PAGE = 25
ARRAYS_FOLDED = 500  # the newest arrays shown folded in the jobs list (older ones: /arrays/<id>/)
TASKS_PER_PAGE = 50


def _jobs_table(request, jobs):
    page = Paginator(jobs, JOBS_PER_PAGE).get_page(request.GET.get("page"))
    rows = list(page.object_list)
    selectors.fold_arrays(rows)  # an array's row: its first task, shown as the array
    selectors.add_row_times(rows)
    live = any(
        job.state in JOB_ACTIVE or getattr(job, "array_row", {}).get("state") == "active"
        for job in rows
    )
    return {"page": page, "jobs": rows, "live": live}


def _folded(request, jobs):
    """Jobs outside arrays, and one row per job array (its first task's), newest first."""
    arrays = visible_arrays(request.user).order_by("-created_at")[:ARRAYS_FOLDED]
    return jobs.filter(Q(array__isnull=True) | Q(pk__in=selectors.first_task_ids(arrays)))


@login_required
def dashboard(request):
    membership = membership_of(request.user)
    jobs = (
        visible_jobs(request.user).select_related("tier", "gpu_sku", "user").order_by("-created_at")
    )
    context = _jobs_table(request, _folded(request, jobs)[:10])
    context.update(membership=membership, capacity=selectors.capacity_by_sku())
    if membership is not None:
        context["use"] = selectors.tenant_use(membership.tenant)
    if request.htmx:
        return render(request, "web/_jobs_table.html", context)
    return render(request, "web/dashboard.html", context)


@login_required
def job_list(request):
    state, tier = request.GET.get("state", ""), request.GET.get("tier", "")
    jobs = (
        visible_jobs(request.user).select_related("tier", "gpu_sku", "user").order_by("-created_at")
    )
    if state in JobState.values:
        jobs = jobs.filter(state=state)  # tasks of arrays too, each its own row
    else:
        jobs = _folded(request, jobs)
    if tier:
        jobs = jobs.filter(tier__name=tier)
    context = _jobs_table(request, jobs)
    context.update(state=state, tier=tier)
    if request.htmx:
        return render(request, "web/_jobs_table.html", context)
    context.update(states=JobState.values, tiers=Tier.objects.values_list("name", flat=True))
    return render(request, "web/job_list.html", context)


@login_required
def job_detail(request, job_id):
    job = get_object_or_404(job_queryset(request.user), pk=job_id)
    shaped = JobSerializer(job).data
    now = timezone.now()
    # The exit code is shown once, beside the state: reasons that only repeat it read as none.
    events = list(job.events.filter(kind="state").order_by("created_at", "id"))
    attempts = list(job.attempts.all())
    for row in events + attempts:
        row.shown_reason = selectors.without_exit_code(row.reason)
    membership = membership_of(request.user)
    context = {
        "job": job,
        "reason": selectors.without_exit_code(job.reason),
        "times": selectors.job_times(job, now),
        "attempts": attempts,
        "events": events,
        "artifacts": job.artifacts.all(),
        "log": selectors.log_tail(job),
        "chart": selectors.progress_chart(job, now),
        "can_resubmit": membership is not None and membership.can_submit,
        "idempotency_key": submit.new_idempotency_key(),
        "queue_position": shaped["queue_position"],
        "estimated_start_at": shaped["estimated_start_at"],
        "depends_on": shaped["depends_on"],
        "live": job.state not in JOB_TERMINAL,
        "can_cancel": job.state in JOB_ACTIVE and can_cancel(request.user, job),
    }
    if request.htmx:
        return render(request, "web/_job_live.html", context)
    return render(request, "web/job_detail.html", context)


@login_required
@require_POST
def job_cancel(request, job_id):
    job = get_object_or_404(visible_jobs(request.user), pk=job_id)
    if not can_cancel(request.user, job):
        return HttpResponseForbidden("You may not cancel this job.")
    try:
        services.job_cancel(job=job, actor=f"user:{request.user.username}")
        messages.success(request, "Job cancelled.")
    except services.ServiceError as error:
        messages.warning(request, error.message)
    return redirect("web-job-detail", job_id=job.pk)


@login_required
@require_POST
def job_resubmit(request, job_id):
    """The same spec as a new job, through the API's submit (apps/web/resubmit.py)."""
    job = get_object_or_404(job_queryset(request.user), pk=job_id)
    membership = membership_of(request.user)
    if membership is None or not membership.can_submit:
        return HttpResponseForbidden("Your role may not submit jobs.")
    made, refused = resubmit.resubmit(job=job, membership=membership, user=request.user,
                                      idempotency_key=request.POST.get("idempotency_key") or None)  # fmt: skip
    if made is None:
        messages.warning(request, f"Not resubmitted: {refused}")
        return redirect("web-job-detail", job_id=job.pk)
    messages.success(request, f"Resubmitted {job.name} as a new job.")
    return redirect("web-job-detail", job_id=made.pk)


@login_required
def job_new(request):
    membership = membership_of(request.user)
    templates = list(JobTemplate.objects.all())
    data = request.POST if request.method == "POST" else request.GET
    template = _chosen_template(templates, data.get("template"))
    outcome = submit.Outcome()
    if request.method == "POST":
        if membership is None or not membership.can_submit:
            return HttpResponseForbidden("Your role may not submit jobs.")
        outcome = submit.submit(
            membership=membership, user=request.user, data=request.POST, template=template,
            workdir=request.FILES.get("workdir"),
        )  # fmt: skip
        if outcome.array is not None:
            return redirect("web-array-detail", array_id=outcome.array.pk)
        if outcome.job is not None:
            return redirect("web-job-detail", job_id=outcome.job.pk)
    context = {
        "templates": templates,
        "template": template,
        "params": submit.param_fields(template, request.POST or None, outcome.param_errors),
        "errors": outcome.errors,
        "form": request.POST,
        "capacity": selectors.capacity_by_sku(),
        "tiers": Tier.objects.filter(rank__lte=membership.tenant.tier.rank) if membership else [],
        "membership": membership,
        "idempotency_key": submit.new_idempotency_key(),
    }
    if request.htmx and request.method == "GET":
        return render(request, "web/_params.html", context)
    status = 400 if request.method == "POST" else 200
    return render(request, "web/job_new.html", context, status=status)


def _chosen_template(templates: list[JobTemplate], name: str | None) -> JobTemplate | None:
    by_name = {t.name: t for t in templates}
    return by_name.get(name or "") or (templates[0] if templates else None)


@login_required
def usage(request):
    membership = membership_of(request.user)
    context = {"membership": membership}
    if membership is not None:
        context["use"] = selectors.tenant_use(membership.tenant)
        context["admission"] = admission_usage(tenant=membership.tenant, user=request.user,
                                               limits=context["use"]["limits"])  # fmt: skip
        context["days"] = selectors.gpu_hours_by_day(membership.tenant)
        context["day_chart"] = selectors.day_chart(context["days"])
        context["webhooks"] = Webhook.objects.filter(tenant=membership.tenant)
        context["deliveries"] = WebhookDelivery.objects.filter(
            webhook__tenant=membership.tenant
        ).select_related("webhook", "event")[:20]
    return render(request, "web/usage.html", context)


# --- job arrays (docs/arrays.md) ------------------------------------------------------------------


@login_required
def array_detail(request, array_id):
    """One array: its counts and progress bar by state, its tasks (rows and the ones not yet
    queued as jobs alike) page by page, filtered by state; cancel-all and requeue-failed."""
    array = get_object_or_404(
        visible_arrays(request.user).select_related("tenant", "user", "tier"), pk=array_id
    )
    state = request.GET.get("state", "")
    counts = array_tasks.counts(array)
    try:
        number = max(1, int(request.GET.get("page", "1")))
    except ValueError:
        number = 1
    total, tasks = array_tasks.tasks(array, state=state if state in JobState.values else None,
                                     offset=(number - 1) * TASKS_PER_PAGE, limit=TASKS_PER_PAGE)  # fmt: skip
    pages = max(1, -(-total // TASKS_PER_PAGE))
    changeable = can_cancel(request.user, array)
    context = {
        "array": array, "counts": counts, "bar": selectors.state_bar(counts, array.size),
        "done": sum(counts[s] for s in JOB_TERMINAL), "state": state,
        "tasks": array_rows.task_rows(array, tasks, timezone.now()),
        "shared_params": array_rows.shared_params(array),
        "states": JobState.values, "number": min(number, pages), "pages": pages, "total": total,
        "live": array.ended_at is None and array.cancelled_at is None,
        "can_cancel": changeable and array.cancelled_at is None and array.ended_at is None,
        "can_requeue": changeable and array.cancelled_at is None and counts[JobState.FAILED] > 0,
    }  # fmt: skip
    if request.htmx:
        return render(request, "web/_array_live.html", context)
    return render(request, "web/array_detail.html", context)


@login_required
@require_POST
def array_cancel(request, array_id):
    array = get_object_or_404(visible_arrays(request.user), pk=array_id)
    if not can_cancel(request.user, array):
        return HttpResponseForbidden("You may not cancel this array.")
    try:
        array_tasks.array_cancel(array=array, actor=f"user:{request.user.username}")
        messages.success(request, "Array cancelled: every task ends cancelled.")
    except services.ServiceError as error:
        messages.warning(request, error.message)
    return redirect("web-array-detail", array_id=array.pk)


@login_required
@require_POST
def array_requeue_failed(request, array_id):
    array = get_object_or_404(visible_arrays(request.user), pk=array_id)
    if not can_cancel(request.user, array):
        return HttpResponseForbidden("You may not change this array.")
    try:
        n = array_tasks.requeue_failed(array=array, actor=f"user:{request.user.username}")
        messages.success(request, f"{n} failed task(s) requeued.")
    except services.ServiceError as error:
        messages.warning(request, error.message)
    return redirect("web-array-detail", array_id=array.pk)
